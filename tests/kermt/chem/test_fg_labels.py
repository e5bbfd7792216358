"""Functional-group labels equal upstream's fgtasklabel generator and RDKit's own fr_* fragment counts."""

from __future__ import annotations

import numpy as np
from rdkit import Chem
from rdkit.Chem import Fragments

from kermt.chem.descriptors import molecule_features
from kermt.chem.fg_labels import FG_NAMES, FG_SIZE, fg_labels
from tests.conftest import DATA_DIR

ORACLE = np.load(DATA_DIR / "kermt_upstream_pretrain" / "pretrain_step.npz")
MOLS = [Chem.MolFromSmiles(str(s)) for s in ORACLE["smiles"]]


def test_labels_equal_upstream_fgtasklabel() -> None:
    labels = fg_labels(MOLS)
    assert labels.dtype == np.uint8 and labels.shape == (26, FG_SIZE) == ORACLE["fg_labels"].shape
    np.testing.assert_array_equal(labels, ORACLE["fg_labels"])
    assert 0 < labels.sum() < labels.size  # the fixture exercises both values


def test_labels_are_rdkit_fragment_counts_binarised() -> None:
    expected = np.array([[getattr(Fragments, name)(mol) > 0 for name in FG_NAMES] for mol in MOLS], dtype=np.uint8)
    np.testing.assert_array_equal(fg_labels(MOLS), expected)
    assert FG_NAMES[0] == "fr_Al_COO" and FG_NAMES[-1] == "fr_urea" and len(set(FG_NAMES)) == 85


def test_labels_equal_the_featurisers_fgtasklabel_generator() -> None:
    np.testing.assert_array_equal(fg_labels(MOLS), molecule_features(MOLS, ["fgtasklabel"]))
