"""Standardisation before featurisation: a salt featurises as its parent acid, the model's SMILES is recorded where
it changed, nothing else moves, and a bad setting is a one-line error."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kermt.checkpoint.spec import FeatureSettings
from kermt.chem.standardize import MoleculePrep, standardize
from kermt.chem.validation import parse_smiles
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.errors import UserError

PARENT = MoleculePrep("parent")
SALTS = {  # input -> the SMILES the model sees
    "CC(=O)[O-].[Na+]": "CC(=O)O",
    "O=C([O-])c1ccccc1.[K+]": "O=C(O)c1ccccc1",
    "CCN.Cl": "CCN",
    "[NH3+]CC(=O)[O-]": "NCC(=O)O",
}
UNCHANGED = ["CCO", "c1ccncc1", "C[N+](C)(C)C", "CC(=O)O"]  # a quaternary ammonium has no neutral form


def test_a_salt_featurises_as_its_parent_and_says_what_the_model_saw():
    salts, parents = list(SALTS), list(SALTS.values())
    done = featurize_smiles(salts + UNCHANGED, ("rdkit_2d_normalized",), prep=PARENT)
    assert done.valid.all() and done.smiles == tuple(salts + UNCHANGED)  # the input, as given
    assert done.model_smiles == tuple(parents) + ("",) * len(UNCHANGED)
    acids = featurize_smiles(parents, ("rdkit_2d_normalized",))
    for name, values in acids.select(range(len(parents))).to_arrays().items():
        if name not in ("smiles", "model_smiles"):
            np.testing.assert_array_equal(done.select(range(len(parents))).to_arrays()[name], values, err_msg=name)


def test_a_parent_with_no_readable_neutral_form_stays_charged_and_the_row_stays_valid():
    # ferrocene's largest organic fragment, the cyclopentadienide, uncharges to 'c1cccc1', which RDKit cannot
    # kekulise: the charged fragment is the parent. A lone metal has no organic fragment: it stays as given.
    done = featurize_smiles(["[CH-]1C=CC=C1.[CH-]1C=CC=C1.[Fe+2]", "[Fe+2]", "CC(=O)[O-].[Na+]"], prep=PARENT)
    assert done.valid.all() and done.model_smiles == ("c1cc[cH-]c1", "", "CC(=O)O")
    anion = featurize_smiles(["c1cc[cH-]c1"])
    for name in ("atom_codes", "atom_values", "bond_codes"):  # the model sees exactly the anion
        np.testing.assert_array_equal(done.select([0]).to_arrays()[name], anion.to_arrays()[name], err_msg=name)


def test_none_changes_nothing_and_is_the_library_default():
    plain = featurize_smiles(list(SALTS))
    assert plain.model_smiles == ("",) * len(SALTS)
    assert plain.graphs.atom_counts.tolist() == [5, 10, 4, 5]  # the counter-ions stay, as upstream
    mol, _ = parse_smiles("CC(=O)[O-].[Na+]")
    assert standardize(mol, "none") == (mol, "")


def test_standardisation_is_deterministic_and_cheap_on_neutral_molecules():
    smiles = ["CC(=O)Nc1ccc(O)cc1"] * 2000
    started = time.process_time()
    first = featurize_smiles(smiles, prep=PARENT)
    assert time.process_time() - started < 30  # featurisation itself; the check is one fragment, no charge
    assert first.model_smiles == ("",) * 2000
    again = featurize_smiles(list(SALTS) * 3, prep=PARENT)
    assert again.model_smiles == tuple(SALTS.values()) * 3


def test_model_smiles_survive_arrays_select_and_concat():
    done = featurize_smiles(list(SALTS) + ["CCO"], prep=PARENT)
    back = FeaturizedMolecules.from_arrays(done.to_arrays())
    assert back.model_smiles == done.model_smiles
    assert done.select([4, 0]).model_smiles == ("", "CC(=O)O")
    assert FeaturizedMolecules.concat([done, done]).model_smiles == done.model_smiles * 2
    old = {k: v for k, v in done.to_arrays().items() if k != "model_smiles"}  # stored before the column existed
    assert FeaturizedMolecules.from_arrays(old).model_smiles == ("",) * 5


def test_a_bad_setting_is_one_line_naming_it():
    with pytest.raises(UserError, match=r"^standardize 'tautomer' is not one of parent, none$"):
        MoleculePrep("tautomer")  # type: ignore[arg-type]  # the wrong value is the test
    with pytest.raises(UserError, match=r"^max_heavy_atoms 0: must be"):
        MoleculePrep(max_heavy_atoms=0)
    with pytest.raises(UserError, match=r"features.standardize 'yes' is not one of parent, none"):
        FeatureSettings(standardize="yes")  # type: ignore[arg-type]  # the wrong value is the test


def standardizing_checkpoint(directory, name: str = "ckpt_ft_cls.pt"):
    """An upstream fixture model saved natively as a model finetuned here records it: standardize parent."""
    import dataclasses

    from kermt.checkpoint import read_checkpoint, save_native
    from tests.conftest import FIXTURE_DIR

    checkpoint = read_checkpoint(FIXTURE_DIR / name)
    spec = dataclasses.replace(checkpoint.spec, features=dataclasses.replace(checkpoint.spec.features,
                                                                             standardize="parent"))
    return save_native(directory, checkpoint.state_dict, spec, passthrough=checkpoint.passthrough)


def test_a_checkpoint_records_its_standardisation_and_an_upstream_one_none(tmp_path):
    from kermt.checkpoint import export_upstream, read_checkpoint
    from tests.conftest import FIXTURE_DIR

    assert read_checkpoint(FIXTURE_DIR / "ckpt_ft_cls.pt").spec.features.standardize == "none"
    native = read_checkpoint(standardizing_checkpoint(tmp_path / "model"))
    assert native.spec.features.standardize == "parent"
    export_upstream(tmp_path / "model.pt", native.state_dict, native.spec, passthrough=native.passthrough)
    assert read_checkpoint(tmp_path / "model.pt").spec.features.standardize == "parent"  # kept in the export's args
