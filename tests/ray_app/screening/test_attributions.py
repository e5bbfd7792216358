"""`kermt predict --attributions`: per task ``<task>_atoms`` (a JSON list, one value per heavy atom of the SMILES the
model saw), ``<task>_baseline`` and, with descriptors, ``<task>_descriptors``; the same file from either engine and
from kermt.load_run; a mode or molecule that cannot have them gets a note and empty cells, never a failed run.
`kermt eval --attributions` writes the same columns, with the labels, to <stem>_attributions.csv."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from rdkit import Chem

import kermt
from tests.conftest import FIXTURE_DIR
from tests.kermt.chem.test_standardize import standardizing_checkpoint
from tests.ray_app.screening.engines import main_eval, main_predict
from tests.ray_app.screening.test_load_run import QUERY
from tests.ray_app.screening.test_local import _both
from ray_app.screening.commands import main_predict as main_predict_on_either

REGRESSION = str(FIXTURE_DIR / "ckpt_ft_reg.pt")  # upstream padding, rdkit_2d_normalized descriptors


def _atoms(frame: pd.DataFrame, column: str) -> list:
    return [json.loads(cell) if isinstance(cell, str) else None for cell in frame[column]]


def test_the_attribution_columns_are_the_same_on_either_engine_and_add_up(ray_cluster, tmp_path):
    pd.DataFrame({"smiles": QUERY[:14]}).to_csv(tmp_path / "q.csv", index=False)
    flags = ["--data_path", str(tmp_path / "q.csv"), "--checkpoint_path", REGRESSION, "--attributions",
             "--batch_size", "7"]
    local, on_ray = _both(main_predict_on_either, tmp_path, "preds.csv", flags)
    assert local.read_bytes() == on_ray.read_bytes()
    frame = pd.read_csv(local)
    assert list(frame.columns[:9]) == ["smiles", "t1", "t2", "t1_atoms", "t1_baseline", "t1_descriptors",
                                       "t2_atoms", "t2_baseline", "t2_descriptors"]
    valid = frame["valid"].to_numpy()
    atoms = _atoms(frame, "t1_atoms")
    assert [a is None for a in atoms] == list(~valid) and (~valid).sum() == 1
    for row in np.flatnonzero(valid):
        assert len(atoms[row]) == Chem.MolFromSmiles(frame["smiles"][row]).GetNumAtoms()
    total = np.array([sum(a) for a in np.array(atoms, dtype=object)[valid]]) + frame["t1_descriptors"][valid]
    gap = frame["t1"][valid] - frame["t1_baseline"][valid]
    assert np.abs(total - gap).mean() < 0.05 * np.abs(gap).mean()


def test_load_run_gives_kermt_predicts_attribution_columns(tmp_path):
    pd.DataFrame({"smiles": QUERY}).to_csv(tmp_path / "q.csv", index=False)
    assert main_predict(["--data_path", str(tmp_path / "q.csv"), "--output_path", str(tmp_path / "p.parquet"),
                         "--checkpoint_path", REGRESSION, "--attributions"]) == 0
    theirs = pd.read_parquet(tmp_path / "p.parquet")
    ours = kermt.load_run(REGRESSION).predict(QUERY, attributions=True)
    assert list(ours.columns) == list(theirs.columns)
    for name in ("t1_atoms", "t2_atoms"):
        assert _atoms(ours, name) == _atoms(theirs, name)
    np.testing.assert_allclose(ours["t2_descriptors"], theirs["t2_descriptors"], rtol=1e-9, equal_nan=True)


def test_atoms_follow_the_smiles_the_model_saw(tmp_path):
    """A model that standardises: a salt's atoms are its parent's (model_smiles), in that SMILES' parse order."""
    model = standardizing_checkpoint(tmp_path / "model")
    frame = kermt.load_run(model).predict(["CC(=O)[O-].[Na+]", "c1ccccc1O"], attributions=True)
    parent = frame["model_smiles"][0]
    assert parent and len(_atoms(frame, "c1_atoms")[0]) == Chem.MolFromSmiles(parent).GetNumAtoms() == 4
    assert len(_atoms(frame, "c1_atoms")[1]) == 7


def test_a_mode_or_molecule_without_attributions_gets_a_note_and_empty_cells(tmp_path, capsys):
    long_chain = "C" * 120  # over the attributions' budget of heavy atoms, under --max_heavy_atoms
    pd.DataFrame({"smiles": ["CCO", long_chain, "c1ccccc1"]}).to_csv(tmp_path / "q.csv", index=False)
    common = ["--data_path", str(tmp_path / "q.csv"), "--checkpoint_path", REGRESSION, "--attributions"]
    assert main_predict([*common, "--output_path", str(tmp_path / "p.csv")]) == 0
    err = capsys.readouterr().err
    assert ("note: 1 molecule(s) of " in err and "more than 100 heavy atoms, the attributions' budget (e.g. line 3)"
            in err)
    frame = pd.read_csv(tmp_path / "p.csv")
    assert frame["t1"].notna().all() and [a is None for a in _atoms(frame, "t1_atoms")] == [False, True, False]
    assert frame["t1_baseline"].isna().tolist() == [False, True, False]
    assert main_predict([*common, "--output_path", str(tmp_path / "u.csv"), "--upstream_batching"]) == 0
    assert "note: the attribution columns stay empty: --upstream_batching makes each prediction depend on its " \
           "batch-mates" in capsys.readouterr().err
    frame = pd.read_csv(tmp_path / "u.csv")
    assert frame["t1"].notna().all() and frame["t1_atoms"].isna().all() and frame["t2_descriptors"].isna().all()


def test_eval_writes_predicts_attribution_columns_with_the_labels_beside_its_test_result(tmp_path, capsys):
    """kermt eval --attributions: <stem>_attributions.csv holds kermt predict --attributions' file of the input
    (invalid and over-budget rows included) with each task's label as <task>_target; test_result.csv is unchanged."""
    labelled = pd.read_csv(FIXTURE_DIR / "smiles.csv")
    extra = pd.DataFrame({"smiles": ["not a smiles", "C" * 120], "t1": [1.0, 2.0], "t2": [0.5, None]})
    pd.concat([labelled, extra]).to_csv(tmp_path / "labelled.csv", index=False)
    common = ["--data_path", str(tmp_path / "labelled.csv"), "--checkpoint_path", REGRESSION]
    assert main_eval([*common, "--output_path", str(tmp_path / "plain" / "test_result.csv")]) == 0
    assert not list((tmp_path / "plain").glob("*_attributions.csv"))  # only when asked
    assert main_eval([*common, "--output_path", str(tmp_path / "test_result.csv"), "--attributions"]) == 0
    err = capsys.readouterr().err
    assert f"attributions: wrote {tmp_path / 'test_result_attributions.csv'}" in err
    assert "note: 1 molecule(s) of " in err and "heavy atoms, the attributions' budget (e.g. line 29)" in err
    assert (tmp_path / "test_result.csv").read_bytes() == (tmp_path / "plain" / "test_result.csv").read_bytes()
    written = pd.read_csv(tmp_path / "test_result_attributions.csv")
    assert main_predict([*common, "--output_path", str(tmp_path / "p.csv"), "--attributions"]) == 0
    predicted = pd.read_csv(tmp_path / "p.csv")
    assert list(written.columns) == [*predicted.columns[:9], "t1_target", "t2_target", "valid", "error"]
    for column in predicted.columns[:9]:
        assert written[column].equals(predicted[column]), column
    assert written["t1_atoms"].notna().sum() == len(labelled)  # every valid row within the budget
    labels = pd.read_csv(tmp_path / "labelled.csv")[["t1", "t2"]]
    np.testing.assert_array_equal(written[["t1_target", "t2_target"]], labels)
