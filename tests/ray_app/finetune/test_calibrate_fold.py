"""A fold's calibration step on real arrays, without a cluster (the end-to-end run is in test_calibration.py, slow):
the file and run.json record, the plain fallback with one member, a validation split too small to calibrate."""

from __future__ import annotations

import types

import numpy as np
import pytest

from kermt.run_layout import RunLayout
from kermt.data.scalers import StandardScaler
from kermt.uncertainty import load_calibrations
from ray_app.finetune.calibrate import calibrate_fold, validation_set
from ray_app.finetune.config import FinetuneConfig


def _fold_inputs(tmp_path, rows: int):
    """A stand-in for the run's settings and the fold's splits with the fields the step reads; scaled labels."""
    rng = np.random.default_rng(0)
    raw = rng.normal(loc=5.0, scale=2.0, size=(rows, 1))
    scaler = StandardScaler.fit(raw)
    setup = types.SimpleNamespace(dataset_type="regression", task_names=["logS"], save_dir=tmp_path,
                                  layout=RunLayout(tmp_path),
                                  config=FinetuneConfig(data_path="d.csv"))
    splits = types.SimpleNamespace(val=types.SimpleNamespace(targets=scaler.transform(raw)), target_scaler=scaler)
    members = [raw + rng.normal(scale=0.5, size=raw.shape) for _ in range(2)]
    return setup, splits, raw, members


def test_two_members_normalised_on_label_units(tmp_path, capsys):
    setup, splits, raw, members = _fold_inputs(tmp_path, rows=40)
    record = calibrate_fold(setup, 0, validation_set(0, splits), members)
    calibration = load_calibrations(str(tmp_path / "fold_0" / "calibration.json"))["logS"]
    mu, sigma = np.mean(members, axis=0)[:, 0], np.std(members, axis=0)[:, 0]
    expected = np.sort(np.abs(raw[:, 0] - mu) / np.maximum(sigma, calibration.sigma_floor))
    np.testing.assert_allclose(calibration.scores, expected, rtol=1e-12)  # labels de-scaled before scoring
    assert record["method"] == "normalised" and record["tasks"]["logS"]["n"] == 40
    assert "fold 0: calibrated (normalised conformal)" in capsys.readouterr().out


def test_one_variance_head_member_keeps_normalised_with_its_own_sigma(tmp_path, capsys):
    setup, splits, raw, members = _fold_inputs(tmp_path, rows=40)
    variance = np.random.default_rng(1).uniform(0.1, 1.0, size=raw.shape)  # label units, as predicted by an MVE head
    record = calibrate_fold(setup, 0, validation_set(0, splits), members[:1], [variance])
    calibration = load_calibrations(str(tmp_path / "fold_0" / "calibration.json"))["logS"]
    sigma = np.sqrt(variance[:, 0])  # one member: the total std is its own predicted std
    expected = np.sort(np.abs(raw[:, 0] - members[0][:, 0]) / np.maximum(sigma, calibration.sigma_floor))
    np.testing.assert_allclose(calibration.scores, expected, rtol=1e-12)
    assert record["method"] == "normalised" and "plain conformal" not in capsys.readouterr().out


def test_one_member_falls_back_to_plain_and_a_small_split_is_skipped(tmp_path, capsys):
    setup, splits, _, members = _fold_inputs(tmp_path, rows=40)
    assert calibrate_fold(setup, 0, validation_set(0, splits), members[:1])["method"] == "plain"
    assert "one model per fold has no spread, so its intervals use plain conformal" in capsys.readouterr().out
    setup, splits, _, members = _fold_inputs(tmp_path, rows=10)
    record = calibrate_fold(setup, 1, validation_set(1, splits), members)
    assert record["file"] is None and "has 10 labelled molecule(s)" in record["reason"]
    assert not (tmp_path / "fold_1" / "calibration.json").exists()
    assert "fold 1: no calibration (" in capsys.readouterr().out


def test_a_small_split_names_the_flag_of_the_command_that_sized_it(tmp_path):
    setup, splits, _, members = _fold_inputs(tmp_path, rows=10)
    reason = calibrate_fold(setup, 0, validation_set(0, splits), members)["reason"]
    assert "use a larger validation split (--split_sizes)" in reason
    setup.config = FinetuneConfig(data_path="d.csv").with_split_flag("--validation_share")  # an explore surrogate
    reason = calibrate_fold(setup, 0, validation_set(0, splits), members)["reason"]
    assert "use a larger validation split (--validation_share)" in reason and "--split_sizes" not in reason


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_a_classification_fold_gets_calibrated_probabilities_and_set_scores(tmp_path, capsys, method):
    from kermt.uncertainty.calibration_file import load_class_calibrations
    from kermt.uncertainty.classification import fit_class_calibrations

    rng = np.random.default_rng(2)
    truth = rng.uniform(0.05, 0.95, size=(200, 2))
    labels = (rng.random(truth.shape) < truth).astype(float)
    labels[:5, 1] = np.nan  # unlabelled molecules are skipped per task
    overconfident = 1 / (1 + np.exp(-2.5 * np.log(truth / (1 - truth))))
    members = [np.clip(overconfident + rng.normal(scale=0.02, size=truth.shape), 0.01, 0.99) for _ in range(2)]
    setup = types.SimpleNamespace(dataset_type="classification", task_names=["c1", "c2"],
                                  save_dir=tmp_path, layout=RunLayout(tmp_path),
                                  config=FinetuneConfig(data_path="d.csv", class_calibration_method=method))
    splits = types.SimpleNamespace(val=types.SimpleNamespace(targets=labels), target_scaler=None)
    record = calibrate_fold(setup, 0, validation_set(0, splits), members)
    saved = load_class_calibrations(str(tmp_path / "fold_0" / "classification_calibration.json"))
    expected = fit_class_calibrations(["c1", "c2"], np.stack(members), labels, method)
    assert saved == expected and record["method"] == method and record["source"] == "fold_0 validation split"
    assert all(c.method == method for c in saved.values())
    assert record["tasks"]["c2"]["n"] == 195
    assert record["tasks"]["c1"]["calibrated_ece"] < 0.6 * record["tasks"]["c1"]["ece"]  # over-confidence undone
    assert f"fold 0: calibrated ({method} probabilities, conformal sets)" in capsys.readouterr().out
    assert not (tmp_path / "fold_0" / "calibration.json").exists()


def test_a_fold_recalibrated_without_success_keeps_no_earlier_calibration_file(tmp_path, capsys):
    setup, splits, _, members = _fold_inputs(tmp_path, rows=40)
    calibrate_fold(setup, 0, validation_set(0, splits), members)
    assert (tmp_path / "fold_0" / "calibration.json").exists()
    setup, splits, _, members = _fold_inputs(tmp_path, rows=10)  # the same fold, recalibrated on too few molecules
    assert calibrate_fold(setup, 0, validation_set(0, splits), members)["file"] is None
    assert not (tmp_path / "fold_0" / "calibration.json").exists()  # it would describe other settings


def test_the_overlap_line_counts_the_files_molecules_in_any_training_split():
    from kermt.data.featurize import featurize_smiles
    from ray_app.finetune.calibrate import in_training_split, overlap_line
    from ray_app.finetune.prepare import SourceData

    smiles = ["C", "CC", "CCC", "CCCC"]
    source = SourceData("assay.csv", ["t"], np.arange(4), featurize_smiles(smiles), np.zeros((4, 1)), ())
    masks = [in_training_split(smiles, train) for train in (["CC", "CO"], ["CC", "CCC"])]
    assert overlap_line(source, masks) == (
        "warning: --calibration_path assay.csv: 2 of its 4 molecules are also in the training data (fold 0: 1, "
        "fold 1: 2); the model has seen them, so intervals calibrated on them come out too narrow: calibrate on "
        "molecules it never trained on")
    assert overlap_line(source, [in_training_split(smiles, ["CO"])]) is None
