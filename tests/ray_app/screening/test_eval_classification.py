"""`kermt eval` of a classification model: ECE and Brier of its probabilities, and with a classification
calibration beside it, the calibrated ones and its prediction sets; values recomputed from upstream's own
predictions of the same molecules (scikit-learn's Brier, the library's calibration)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import brier_score_loss

from kermt.uncertainty import fit_class_calibration, save_class_calibrations
from kermt.uncertainty.metrics import expected_calibration_error, set_report
from tests.ray_app.screening.engines import main_eval
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import OUTPUTS

TASKS = ("c1", "c2")


def _printed(out: str, task: str) -> dict[str, float]:
    line = next(line for line in out.splitlines() if line.startswith(f"test {task} probabilities"))
    return {k: float(v) for k, v in (part.split(" = ") for part in line.split(": ", 1)[1].split(", "))}


def test_eval_scores_probabilities_then_calibrated_ones_and_sets(tmp_path, capsys):
    data = pd.read_csv(FIXTURE_DIR / "smiles_cls.csv")
    upstream = OUTPUTS["ft_cls_final_prediction"]  # the model's probabilities of these 26 molecules
    common = ["--data_path", str(FIXTURE_DIR / "smiles_cls.csv"), "--output_path", str(tmp_path / "r.csv"),
              "--upstream_batching"]  # upstream's batch of 26: its outputs are the oracle
    assert main_eval([*common, "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_cls.pt")]) == 0
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "r_uncertainty.json").read_text())
    assert written["kind"] == "classification" and written["method"] is None
    assert "probabilities on this file<" in (tmp_path / "r_report.html").read_text()  # the report's table caption
    for t, task in enumerate(TASKS):
        y, p = data[task].to_numpy(), upstream[:, t]
        labelled = ~np.isnan(y)
        assert _printed(printed, task)["brier"] == pytest.approx(brier_score_loss(y[labelled], p[labelled]), abs=1e-4)
        assert written["tasks"][task]["ece"] == pytest.approx(expected_calibration_error(y, p), abs=1e-5)
        assert set(written["tasks"][task]) == {"ece", "brier"}

    model_dir = tmp_path / "model"  # a model with a calibration (fitted on the same molecules: a stand-in)
    model_dir.mkdir()
    shutil.copy(FIXTURE_DIR / "ckpt_ft_cls.pt", model_dir / "model.pt")
    calibrations = {task: fit_class_calibration(task, upstream[:, t], data[task].to_numpy())
                    for t, task in enumerate(TASKS)}
    save_class_calibrations(str(model_dir / "classification_calibration.json"), calibrations, source="test")
    assert main_eval([*common, "--checkpoint_dir", str(model_dir), "--interval", "0.8"]) == 0
    captured = capsys.readouterr()
    assert "80% prediction sets and platt-calibrated probabilities, calibrated on 26 molecule(s)" in captured.err
    written = json.loads((tmp_path / "r_uncertainty.json").read_text())
    assert written["method"] == "platt" and written["level"] == 0.8
    caption = "probabilities on this file (platt-calibrated, 0.8 prediction sets)"
    assert caption in (tmp_path / "r_report.html").read_text()
    # the sets are scored from eval's own probabilities (its output file): the calibration was fitted on upstream's,
    # which differ from ours by float32 rounding (6e-8), so the molecule whose score is the conformal quantile can
    # fall on either side of it
    ours = pd.read_csv(tmp_path / "r.csv", header=[0, 1], index_col=0)["preds"]
    for t, task in enumerate(TASKS):
        y, p = data[task].to_numpy(), upstream[:, t]
        np.testing.assert_allclose(ours[task].to_numpy(), p, atol=1e-6)
        scores = written["tasks"][task]
        assert scores["calibrated_ece"] == pytest.approx(
            expected_calibration_error(y, calibrations[task].calibrated(p)), abs=1e-4)
        assert scores["calibrated_ece"] < scores["ece"]
        expected_sets = set_report(y, calibrations[task].sets(ours[task].to_numpy(), 0.8))
        assert scores["mean_set_size"] == pytest.approx(expected_sets["mean_set_size"])
        assert scores["set_coverage"] == pytest.approx(expected_sets["set_coverage"])
        assert _printed(captured.out, task)["set_coverage"] == pytest.approx(expected_sets["set_coverage"], abs=1e-4)


def test_set_level_too_high_or_a_regression_model_is_a_one_line_error_before_ray_starts(tmp_path, capsys):
    data = pd.read_csv(FIXTURE_DIR / "smiles_cls.csv")
    upstream = OUTPUTS["ft_cls_final_prediction"]
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(FIXTURE_DIR / "ckpt_ft_cls.pt", model_dir / "model.pt")
    save_class_calibrations(str(model_dir / "classification_calibration.json"),
                            {task: fit_class_calibration(task, upstream[:, t], data[task].to_numpy())
                             for t, task in enumerate(TASKS)}, source="test")
    common = ["--data_path", str(FIXTURE_DIR / "smiles_cls.csv"), "--output_path", str(tmp_path / "r.csv")]
    assert main_eval([*common, "--checkpoint_dir", str(model_dir), "--interval", "0.99"]) == 2
    assert "--interval 0.99: task 'c1' was calibrated on 26 molecules, and a 0.99 interval needs at least 99" \
        in capsys.readouterr().err
    (model_dir / "model.pt").unlink()
    shutil.copy(FIXTURE_DIR / "ckpt_ft_reg.pt", model_dir / "model.pt")
    assert main_eval(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(tmp_path / "r.csv"),
                      "--checkpoint_dir", str(model_dir)]) == 2
    assert "classification_calibration.json, but the model is regression: remove that file" in capsys.readouterr().err
    assert not (tmp_path / "r.csv").exists()
