"""A finetune calibrates each fold's ensemble on its validation split; `kermt predict --interval` serves the
intervals. One small real run (2 members, a validation split large enough to calibrate) shared by the tests."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from kermt.uncertainty import load_calibrations
from tests.ray_app.screening.engines import main_predict
from tests.ray_app.finetune.tiny_runs import demo_head, tiny_finetune

# A finetune of its own (the shared runs in test_finetune.py have validation splits of 8 molecules, too few to
# calibrate): 130-220 s on the 2-core dev machine, so outside the default suite.
pytestmark = pytest.mark.slow
TASKS = ["logp", "tpsa_100", "fsp3"]


@pytest.fixture(scope="module")
def calibrated_run(ray_cluster, tmp_path_factory):
    """(save_dir, summary, output, the validation rows as a CSV): 120 molecules, 70 % of them validation (each
    task has NaN labels: >= 20 labelled per task are needed)."""
    base = tmp_path_factory.mktemp("calibrated")
    data, save_dir = demo_head(120, base / "data.csv"), base / "run"
    summary, printed = tiny_finetune(save_dir, data, "--ensemble_size", "2", "--split_sizes", "0.2", "0.7", "0.1")
    val_rows = json.loads((save_dir / "splits.json").read_text())["fold_0"]["val"]
    val_csv = base / "val.csv"
    pd.read_csv(data).iloc[val_rows].to_csv(val_csv, index=False)
    return save_dir, summary, printed, val_csv


def test_finetune_saves_and_records_the_fold_calibration(calibrated_run):
    save_dir, _, out, val_csv = calibrated_run
    labelled = pd.read_csv(val_csv)[TASKS].notna().sum()  # NaN labels are skipped per task
    calibrations = load_calibrations(str(save_dir / "fold_0" / "calibration.json"))
    assert sorted(calibrations) == sorted(TASKS)
    assert {t: c.n for t, c in calibrations.items()} == labelled.to_dict() and min(labelled) >= 20
    assert all(c.method == "normalised" and c.z_scale > 0 for c in calibrations.values())
    record = json.loads((save_dir / "run.json").read_text())["calibration"]["fold_0"]
    assert record["file"] == "fold_0/calibration.json" and record["method"] == "normalised"
    assert record["tasks"]["logp"]["n"] == labelled["logp"]
    assert "fold 0: calibrated (normalised conformal) on fold_0 validation split" in out


def test_predict_interval_covers_its_own_validation_split(calibrated_run, tmp_path):
    save_dir, _, _, val_csv = calibrated_run
    out = tmp_path / "preds.csv"
    assert main_predict(["--data_path", str(val_csv), "--output_path", str(out), "--checkpoint_dir", str(save_dir),
                         "--interval", "0.9", "--uncertainty", "--drop_extra_columns"]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == ["smiles", *TASKS, *(t + "_std" for t in TASKS),
                                   *(f"{t}_{b}" for t in TASKS for b in ("lower", "upper")), "valid", "error",
                                   "model_smiles"]  # the run standardises (finetune's default parent, docs/inputs.md)
    # empty in every row (read back as NaN): the demo's first 120 molecules are neutral and of one fragment each, so
    # the model saw each as drawn
    assert frame["valid"].all() and frame["model_smiles"].isna().all()
    labels = pd.read_csv(val_csv)
    for task in TASKS:
        lower, mean, upper = (frame[c].to_numpy() for c in (f"{task}_lower", task, f"{task}_upper"))
        assert np.all(lower <= mean) and np.all(mean <= upper)
        width = upper - lower
        assert width.std() > 0.05 * width.mean()  # adaptive: not one width for every molecule
        y = labels[task].to_numpy(float)
        labelled = ~np.isnan(y)
        covered = np.mean((lower <= y) & (y <= upper), where=labelled)
        assert covered >= 0.89, (task, covered)  # its own calibration set: >= ceil((n+1)0.9)/n up to float ties


def test_interval_bad_inputs_are_one_line_errors(calibrated_run, tmp_path, capsys):
    save_dir, _, _, val_csv = calibrated_run
    common = ["--data_path", str(val_csv), "--output_path", str(tmp_path / "p.csv")]
    assert main_predict([*common, "--checkpoint_dir", str(save_dir), "--interval", "1.5"]) == 2
    assert "interval" in capsys.readouterr().err
    member = save_dir / "fold_0" / "model_0" / "model"
    assert main_predict([*common, "--checkpoint_path", str(member), "--interval", "0.9"]) == 2
    assert "needs the calibrated ensemble: pass --checkpoint_dir" in capsys.readouterr().err
    old = shutil.copytree(save_dir, tmp_path / "old_run", ignore=shutil.ignore_patterns("ray_results"))
    (old / "fold_0" / "calibration.json").unlink()  # as a run trained before calibration existed
    assert main_predict([*common, "--checkpoint_dir", str(old), "--interval", "0.9"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]  # the one error line, after predict's own log lines
    assert error.startswith("kermt predict: error: --interval 0.9: --checkpoint_dir")
    assert "has no calibration" in error and "`kermt finetune` calibrates" in error
    assert main_predict([*common, "--checkpoint_dir", str(save_dir), "--interval", "0.99"]) == 2
    assert "molecules, and a 0.99 interval needs at least 99" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()


def test_eval_scores_the_intervals_of_a_calibrated_model(calibrated_run, tmp_path, capsys):
    from tests.ray_app.screening.engines import main_eval

    save_dir, _, _, val_csv = calibrated_run
    out = tmp_path / "test_result.csv"
    assert main_eval(["--data_path", str(val_csv), "--output_path", str(out), "--checkpoint_dir", str(save_dir)]) == 0
    printed = capsys.readouterr().out
    assert "test logp 90% interval: coverage = " in printed and "spearman = " in printed
    report = json.loads((tmp_path / "test_result_uncertainty.json").read_text())
    assert report["level"] == 0.9 and report["method"] == "normalised"
    for task in TASKS:
        values = report["tasks"][task]
        assert values["coverage"] >= 0.89 and values["mean_width"] > 0 and np.isfinite(values["nll"])
        assert set(values) == {"coverage", "mean_width", "width_over_rmse", "miscalibration_area", "ence",
                               "spearman", "nll"}


def test_mondrian_domain_calibration_is_fitted_and_served_with_the_domain_distance(calibrated_run, tmp_path, capsys):
    """--calibration_method mondrian_domain calibrates on the validation molecules' applicability-domain distances
    (a copy of the run: in another save_dir it trains again); predict --interval reads the same distances without
    --applicability_domain, and --calibration_path refits the same method on the file's distances."""
    from kermt.uncertainty import intervals

    save_dir, _, _, val_csv = calibrated_run
    run = shutil.copytree(save_dir, tmp_path / "run")
    _, printed = tiny_finetune(run, save_dir.parent / "data.csv", "--ensemble_size", "2", "--split_sizes", "0.2",
                               "0.7", "0.1", "--calibration_method", "mondrian_domain")
    assert "fold 0: calibrated (mondrian_domain conformal) on fold_0 validation split" in printed
    calibrations = load_calibrations(str(run / "fold_0" / "calibration.json"))
    # the report draws the test intervals from each test molecule's spread and distance
    assert (run / "fold_0" / "test_spread.csv").read_text().splitlines()[0] == ",logp,tpsa_100,fsp3,domain_distance"
    assert "intervals not drawn" not in (run / "report.html").read_text()
    with_domain = tmp_path / "domain.csv"
    assert main_predict(["--data_path", str(val_csv), "--output_path", str(with_domain), "--checkpoint_dir",
                         str(run), "--uncertainty", "--applicability_domain", "--drop_extra_columns"]) == 0
    seen, labels = pd.read_csv(with_domain), pd.read_csv(val_csv)
    distance = seen["domain_distance"].to_numpy()
    for task in TASKS:
        labelled = labels[task].notna().to_numpy()
        assert calibrations[task].method == "mondrian_domain"
        np.testing.assert_allclose(sorted(calibrations[task].distances), np.sort(distance[labelled]), rtol=1e-4)
    out = tmp_path / "preds.csv"
    assert main_predict(["--data_path", str(val_csv), "--output_path", str(out), "--checkpoint_dir", str(run),
                         "--interval", "0.9", "--drop_extra_columns"]) == 0
    frame = pd.read_csv(out)
    assert "domain_distance" not in frame.columns  # the distance is read, its columns only with the flag
    for task in TASKS:
        lower, upper = intervals(calibrations[task], seen[task].to_numpy(), seen[f"{task}_std"].to_numpy(), 0.9,
                                 distance)
        np.testing.assert_allclose(frame[f"{task}_lower"], lower, rtol=1e-6)
        np.testing.assert_allclose(frame[f"{task}_upper"], upper, rtol=1e-6)
        y = labels[task].to_numpy(float)
        covered = np.mean((lower <= y) & (y <= upper), where=~np.isnan(y))
        assert covered >= 0.89, (task, covered)  # its own calibration set, within each distance bin
    capsys.readouterr()
    assert main_predict(["--data_path", str(val_csv), "--output_path", str(tmp_path / "file.csv"),
                         "--checkpoint_dir", str(run), "--interval", "0.9", "--calibration_path", str(val_csv),
                         "--drop_extra_columns"]) == 0
    assert "90% intervals: mondrian_domain conformal, calibrated on --calibration_path" in capsys.readouterr().err
    refitted = pd.read_csv(tmp_path / "file.csv")  # the same molecules as the run's validation split: same bounds
    np.testing.assert_allclose(refitted["logp_upper"], frame["logp_upper"], rtol=1e-5)
    # the service's replica and the Python API serve the same bounds from the same run (the distance read, not shown)
    from kermt.inference.trained_run import load_run
    from ray_app.serve.models import load_served_model
    from ray_app.serve.predictor import Predictor
    from ray_app.serve.schemas import PredictJob

    smiles = tuple(frame["smiles"])
    entries = Predictor(load_served_model("m", str(run), default=True, trust_checkpoint=False), 32).predict_smiles(
        [PredictJob(smiles, interval=0.9)])[0]
    assert "domain_distance" not in entries[0]
    np.testing.assert_allclose([e["logp_upper"] for e in entries], frame["logp_upper"], rtol=1e-6)
    api = load_run(run).predict(list(smiles), interval=0.9)
    np.testing.assert_allclose(api["logp_lower"], frame["logp_lower"], rtol=1e-6)
    from tests.ray_app.screening.engines import main_eval

    capsys.readouterr()
    assert main_eval(["--data_path", str(val_csv), "--output_path", str(tmp_path / "eval.csv"), "--checkpoint_dir",
                      str(run)]) == 0
    report = json.loads((tmp_path / "eval_uncertainty.json").read_text())
    assert report["method"] == "mondrian_domain" and report["tasks"]["logp"]["coverage"] >= 0.89
