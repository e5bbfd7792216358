"""Molecule-level features against upstream's fixture values and descriptastorus itself."""

from __future__ import annotations

import csv
import warnings

import numpy as np
import pytest
from descriptastorus.descriptors import rdNormalizedDescriptors
from rdkit import Chem, DataStructs
from rdkit.Chem import AllChem

from kermt.chem.descriptors import FG_COLUMNS, RDKIT2D_COLUMNS, molecule_features
from tests.conftest import FIXTURE_DIR, SPLITS_DIR

GRAPH = np.load(FIXTURE_DIR / "graph.npz", allow_pickle=False)
OUTPUTS = np.load(FIXTURE_DIR / "outputs.npz", allow_pickle=False)
MOLS = [Chem.MolFromSmiles(str(s)) for s in GRAPH["smiles"]]


@pytest.fixture(scope="module")
def descriptastorus_based() -> np.ndarray:
    return molecule_features(MOLS, ("rdkit_2d_normalized", "rdkit_2d", "fgtasklabel"))


def test_columns_are_upstreams():
    assert RDKIT2D_COLUMNS == tuple(str(c) for c in GRAPH["rdkit2d_columns"])
    assert len(FG_COLUMNS) == 85 and FG_COLUMNS[:2] == ("fr_Al_COO", "fr_Al_OH") and FG_COLUMNS[-1] == "fr_urea"


def test_rdkit_2d_normalized_equals_upstream_datapoint_features(descriptastorus_based):
    normalized = np.nan_to_num(descriptastorus_based[:, :200], nan=0.0)  # the datapoint's NaN -> 0
    np.testing.assert_allclose(normalized, GRAPH["rdkit2d_norm_datapoint"], rtol=0, atol=1e-6)


def test_rdkit_2d_raw_equals_descriptastorus(descriptastorus_based):
    expected = GRAPH["rdkit2d_unnorm_raw_with_flag"][:, 1:]
    # the fixture ran on the input SMILES, we on the canonical ones (as upstream's generator): ~1e-15 relative
    np.testing.assert_allclose(descriptastorus_based[:, 200:400], expected, rtol=1e-9, atol=1e-6, equal_nan=True)


def test_fgtasklabel_equals_upstream_pretraining_labels(descriptastorus_based):
    np.testing.assert_array_equal(descriptastorus_based[:, 400:], OUTPUTS["pt_fg_labels"])


def test_batch_normalisation_equals_descriptastorus_per_molecule_on_drug_like_set():
    with open(SPLITS_DIR / "train_val.csv") as handle:
        smiles = [row[0] for row in list(csv.reader(handle))[1:41]]
    generator = rdNormalizedDescriptors.RDKit2DNormalized()
    canonical = [Chem.MolToSmiles(Chem.MolFromSmiles(s), isomericSmiles=True) for s in smiles]
    expected = np.array([generator.process(s)[1:] for s in canonical], dtype=np.float64)
    got = molecule_features([Chem.MolFromSmiles(s) for s in smiles], ("rdkit_2d_normalized",))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6, equal_nan=True)


def test_morgan_generators_equal_rdkit_legacy_functions():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected_bits, expected_counts = [], []
        for mol in MOLS:
            bits, counts = np.zeros(1), np.zeros(1)
            DataStructs.ConvertToNumpyArray(AllChem.GetMorganFingerprintAsBitVect(mol, 2, nBits=2048), bits)
            DataStructs.ConvertToNumpyArray(AllChem.GetHashedMorganFingerprint(mol, 2, nBits=2048), counts)
            expected_bits.append(bits)
            expected_counts.append(counts)
    got = molecule_features(MOLS, ("morgan", "morgan_count"))
    np.testing.assert_array_equal(got[:, :2048], np.array(expected_bits))
    np.testing.assert_array_equal(got[:, 2048:], np.array(expected_counts))
    assert got[:, 2048:].max() > 1  # counts, not bits


def test_missing_or_invalid_entries_give_nan_rows_and_unknown_names_are_rejected():
    got = molecule_features([None, MOLS[0], "C1CC", str(GRAPH["smiles"][0])],
                            ("fgtasklabel", "rdkit_2d_normalized", "morgan"))
    assert np.isnan(got[[0, 2]]).all() and not np.isnan(got[[1, 3]]).any()
    np.testing.assert_array_equal(got[1], got[3])  # a SMILES entry equals its parsed molecule
    with pytest.raises(ValueError, match="unknown features generator 'rdkit2d'"):
        molecule_features(MOLS[:1], ("rdkit2d",))
