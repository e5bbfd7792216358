"""`kermt predict / eval` with a calibration: a classification run's ``<task>_calibrated`` and ``<task>_set``, and
``--calibration_path`` (recalibration on the user's labelled file), each value recomputed by hand from the library
(kermt.uncertainty) on the predictions the command wrote; and the one-line errors of its bad inputs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from kermt.uncertainty import fit_calibration, fit_class_calibration, intervals, save_class_calibrations
from kermt.uncertainty.metrics import set_report
from tests.ray_app.screening.engines import main_eval, main_predict
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import OUTPUTS, PARITY, ensemble_dir

CLASS_TASKS, REG_TASKS = ("c1", "c2"), ("t1", "t2")
CLS_DATA, REG_DATA = FIXTURE_DIR / "smiles_cls.csv", FIXTURE_DIR / "smiles.csv"


def _with_invalid_rows(source, path, rows: int = 2):
    """``source`` with ``rows`` invalid SMILES appended (labels kept): they must be skipped and counted."""
    frame = pd.read_csv(source)
    bad = pd.DataFrame({"smiles": ["not_a_smiles"] * rows, **{c: [1.0] * rows for c in frame.columns[1:]}})
    pd.concat([frame, bad], ignore_index=True).to_csv(path, index=False)
    return path


@pytest.fixture
def calibrated_cls_dir(tmp_path):
    """A classification "run" (upstream's model.pt) whose classification_calibration.json was fitted on upstream's
    own probabilities of the fixture molecules (a stand-in for a finetune's validation split)."""
    model_dir = tmp_path / "cls_run"
    model_dir.mkdir()
    shutil.copy(FIXTURE_DIR / "ckpt_ft_cls.pt", model_dir / "model.pt")
    labels = pd.read_csv(CLS_DATA)
    calibrations = {task: fit_class_calibration(task, OUTPUTS["ft_cls_final_prediction"][:, t], labels[task])
                    for t, task in enumerate(CLASS_TASKS)}
    save_class_calibrations(str(model_dir / "classification_calibration.json"), calibrations, source="test")
    return model_dir, calibrations


def test_classification_run_writes_calibrated_probabilities_and_sets(calibrated_cls_dir, tmp_path,
                                                                     capsys):
    model_dir, calibrations = calibrated_cls_dir
    data, out = _with_invalid_rows(CLS_DATA, tmp_path / "data.csv", 1), tmp_path / "p.parquet"
    assert main_predict(["--data_path", str(data), "--output_path", str(out), "--checkpoint_dir", str(model_dir),
                         "--interval", "0.8", "--drop_extra_columns", "--upstream_batching"]) == 0
    assert "80% prediction sets and platt-calibrated probabilities, calibrated on 26 molecule(s)" \
        in capsys.readouterr().err
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["smiles", "c1", "c2", "c1_calibrated", "c2_calibrated", "c1_set", "c2_set",
                                   "valid", "error"]
    valid = frame["valid"].to_numpy()
    np.testing.assert_allclose(frame.loc[valid, list(CLASS_TASKS)].to_numpy(), OUTPUTS["ft_cls_final_prediction"],
                               rtol=0, atol=PARITY)  # the task columns stay the raw mean probabilities
    for task in CLASS_TASKS:
        raw = frame.loc[valid, task].to_numpy()
        np.testing.assert_allclose(frame.loc[valid, f"{task}_calibrated"], calibrations[task].calibrated(raw),
                                   rtol=0, atol=1e-12)
        assert frame.loc[valid, f"{task}_set"].tolist() == calibrations[task].sets(raw, 0.8)
        sets = set(frame.loc[valid, f"{task}_set"])
        assert sets <= {"", "0", "1", "0,1"} and len(sets) > 1  # sure of some molecules, not of others
        assert frame.loc[~valid, [f"{task}_calibrated", f"{task}_set"]].isna().all().all()


def test_uncalibrated_classification_predicts_as_before_and_refuses_sets(tmp_path, capsys):
    common = ["--data_path", str(CLS_DATA), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_cls.pt"),
              "--upstream_batching"]  # upstream's batch of 26: its outputs are the oracle
    assert main_predict([*common, "--output_path", str(tmp_path / "p.csv"), "--interval", "0.9"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("kermt predict: error: --interval 0.9: this classification model has no calibration")
    assert "--calibration_path FILE calibrates it" in error and not (tmp_path / "p.csv").exists()
    assert main_predict([*common, "--output_path", str(tmp_path / "p.csv")]) == 0
    assert "note: this model has no classification calibration" in capsys.readouterr().err
    frame = pd.read_csv(tmp_path / "p.csv")
    assert list(frame.columns) == ["smiles", "c1", "c2", "valid", "error"]
    np.testing.assert_allclose(frame[list(CLASS_TASKS)].to_numpy(), OUTPUTS["ft_cls_final_prediction"], rtol=0,
                               atol=PARITY)


def test_calibration_path_recalibrates_classification(calibrated_cls_dir, tmp_path, capsys):
    """The file's fit replaces the run's: here a file whose c1 labels are flipped, so its Platt slope changes sign."""
    model_dir, _ = calibrated_cls_dir
    assay = pd.read_csv(CLS_DATA)
    assay["c1"] = 1 - assay["c1"]
    assay.to_csv(tmp_path / "assay.csv", index=False)
    out = tmp_path / "p.parquet"
    assert main_predict(["--data_path", str(CLS_DATA), "--output_path", str(out), "--checkpoint_dir",
                         str(model_dir), "--calibration_path", str(tmp_path / "assay.csv"), "--interval", "0.8"]) == 0
    assert f"calibrated on --calibration_path {tmp_path / 'assay.csv'} (c1 26, c2 24 labelled" \
        in capsys.readouterr().err
    frame = pd.read_parquet(out)
    for task in CLASS_TASKS:
        raw = frame[task].to_numpy()  # the same molecules in the same batch: the file's own predictions
        expected = fit_class_calibration(task, raw, assay[task].to_numpy(float))
        np.testing.assert_allclose(frame[f"{task}_calibrated"], expected.calibrated(raw), rtol=0, atol=1e-12)
        assert frame[f"{task}_set"].tolist() == expected.sets(raw, 0.8)
    flipped, run = (fit_class_calibration("c1", frame["c1"].to_numpy(), y) for y in (assay["c1"], 1 - assay["c1"]))
    assert np.sign(flipped.params[0][0]) == -np.sign(run.params[0][0]) != 0  # the file's fit, not the run's
    # eval of one model (no run calibration) on the original labels, calibrated on the same file: scored at 0.9
    assert main_eval(["--data_path", str(CLS_DATA), "--output_path", str(tmp_path / "r.csv"), "--checkpoint_path",
                      str(FIXTURE_DIR / "ckpt_ft_cls.pt"), "--calibration_path", str(tmp_path / "assay.csv")]) == 0
    report = json.loads((tmp_path / "r_uncertainty.json").read_text())
    assert report["method"] == "platt" and report["level"] == 0.9
    labels = pd.read_csv(CLS_DATA)["c1"].to_numpy(float)
    assert report["tasks"]["c1"]["set_coverage"] == pytest.approx(set_report(labels, flipped.sets(frame["c1"], 0.9))[
        "set_coverage"])


def test_calibration_path_gives_the_intervals_of_fit_calibration_on_its_predictions(tmp_path, capsys):
    run = ensemble_dir(tmp_path / "run")  # two regression members that disagree: a spread, no calibration.json
    assay = _with_invalid_rows(REG_DATA, tmp_path / "assay.csv")
    common = ["--data_path", str(REG_DATA), "--checkpoint_dir", str(run), "--drop_extra_columns"]
    assert main_predict([*common, "--output_path", str(tmp_path / "plain.csv")]) == 0
    plain = pd.read_csv(tmp_path / "plain.csv")
    assert list(plain.columns) == ["smiles", "t1", "t2", "valid", "error"]  # no flags: the columns of before
    capsys.readouterr()
    assert main_predict([*common, "--output_path", str(tmp_path / "p.parquet"), "--calibration_path", str(assay),
                         "--interval", "0.9", "--uncertainty"]) == 0
    err = capsys.readouterr().err
    assert f"--calibration_path {assay}: 2 of 28 row(s) are not valid molecules and were skipped" in err
    assert f"90% intervals: normalised conformal, calibrated on --calibration_path {assay} (t1 26, t2 24" in err
    frame, labels = pd.read_parquet(tmp_path / "p.parquet"), pd.read_csv(REG_DATA)
    np.testing.assert_allclose(frame[list(REG_TASKS)], plain[list(REG_TASKS)], rtol=0, atol=1e-12)  # unchanged
    for task in REG_TASKS:
        mu, sigma = frame[task].to_numpy(), frame[f"{task}_std"].to_numpy()
        calibration = fit_calibration(task, mu, labels[task].to_numpy(float), sigma)  # the file's own predictions
        lower, upper = intervals(calibration, mu, sigma, 0.9)
        np.testing.assert_allclose(frame[f"{task}_lower"], lower, rtol=0, atol=1e-12)
        np.testing.assert_allclose(frame[f"{task}_upper"], upper, rtol=0, atol=1e-12)
        assert np.ptp(upper - lower) > 0  # normalised: the width follows each molecule's spread


def test_calibration_path_sees_the_mc_dropout_spread_it_serves(tmp_path, capsys):
    """--dropout_samples with --interval is refused with the run's calibration (fitted without MC dropout) but not
    with --calibration_path, whose predictions have the same dropout passes: normalised on their spread."""
    from tests.kermt.test_inference_estimators import _member

    model = _member(tmp_path / "dropout", seed=0, variance=False, dropout=0.2)
    out = tmp_path / "p.csv"
    assert main_predict(["--data_path", str(REG_DATA), "--output_path", str(out), "--checkpoint_path", str(model),
                         "--dropout_samples", "3", "--calibration_path", str(REG_DATA), "--interval", "0.9",
                         "--uncertainty", "--drop_extra_columns"]) == 0
    assert "90% intervals: normalised conformal, calibrated on --calibration_path" in capsys.readouterr().err
    frame, labels = pd.read_csv(out), pd.read_csv(REG_DATA)
    for task in REG_TASKS:
        mu, sigma = frame[task].to_numpy(), frame[f"{task}_std"].to_numpy()
        assert (sigma > 0).all()
        lower, upper = intervals(fit_calibration(task, mu, labels[task].to_numpy(float), sigma), mu, sigma, 0.9)
        np.testing.assert_allclose(frame[[f"{task}_lower", f"{task}_upper"]].to_numpy(), np.stack([lower, upper], 1),
                                   rtol=0, atol=1e-9)


def test_calibration_path_on_one_model_is_plain_conformal_and_eval_scores_it(tmp_path, capsys):
    common = ["--data_path", str(REG_DATA), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"),
              "--calibration_path", str(REG_DATA), "--upstream_batching"]  # upstream's outputs are the oracle
    assert main_eval([*common, "--output_path", str(tmp_path / "test_result.csv")]) == 0
    assert "90% intervals: plain conformal, calibrated on --calibration_path" in capsys.readouterr().err
    report = json.loads((tmp_path / "test_result_uncertainty.json").read_text())
    assert report["method"] == "plain" and report["level"] == 0.9
    labels, preds = pd.read_csv(REG_DATA), OUTPUTS["ft_reg_final_prediction"]
    for t, task in enumerate(REG_TASKS):
        y = labels[task].to_numpy(float)
        half = fit_calibration(task, preds[:, t], y, None, method="plain").quantile(0.9)
        labelled = ~np.isnan(y)
        covered = np.abs(y - preds[:, t])[labelled] <= half
        assert report["tasks"][task]["coverage"] == pytest.approx(covered.mean(), abs=1e-6)
        assert report["tasks"][task]["mean_width"] == pytest.approx(2 * half, rel=1e-5)


def _feature_file(path, smiles, rows=None):
    """rdkit_2d_normalized features (the fixture model's generator) of ``smiles`` as an upstream .npz."""
    from kermt.chem.descriptors import molecule_features
    from kermt.data.feature_files import save_features

    save_features(path, molecule_features(list(smiles)[:rows], ["rdkit_2d_normalized"]))
    return path


def test_a_model_given_feature_files_calibrates_with_the_file_s_own(tmp_path, capsys):
    features = _feature_file(tmp_path / "f.npz", pd.read_csv(REG_DATA)["smiles"])
    common = ["--data_path", str(REG_DATA), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"),
              "--features_path", str(features), "--calibration_path", str(REG_DATA), "--interval", "0.9"]
    assert main_predict([*common, "--output_path", str(tmp_path / "p.csv"), "--calibration_features_path",
                         str(features)]) == 0
    frame, labels = pd.read_csv(tmp_path / "p.csv"), pd.read_csv(REG_DATA)
    for task in REG_TASKS:  # one model: plain conformal on the file's own predictions (the same rows here)
        half = fit_calibration(task, frame[task], labels[task], None, method="plain").quantile(0.9)
        np.testing.assert_allclose(frame[f"{task}_upper"] - frame[task], half, rtol=0, atol=1e-9)
    short = _feature_file(tmp_path / "short.npz", labels["smiles"], rows=5)
    assert main_predict([*common, "--output_path", str(tmp_path / "q.csv"), "--calibration_features_path",
                         str(short)]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert f"--calibration_features_path has 5 rows but {REG_DATA} has 26" in error
    assert not (tmp_path / "q.csv").exists()


def test_calibration_file_errors_before_ray_starts(tmp_path, capsys):
    """Column and flag mistakes are found before the cluster starts (no ray_cluster fixture here)."""
    pd.read_csv(REG_DATA).drop(columns=["t2"]).to_csv(tmp_path / "no_t2.csv", index=False)
    common = ["--data_path", str(REG_DATA), "--output_path", str(tmp_path / "p.csv"), "--checkpoint_path",
              str(FIXTURE_DIR / "ckpt_ft_reg.pt")]
    assert main_predict([*common, "--calibration_path", str(tmp_path / "no_t2.csv"), "--interval", "0.9"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert f"--calibration_path {tmp_path / 'no_t2.csv'} has no column 't2'" in error
    assert main_predict([*common, "--calibration_path", str(REG_DATA)]) == 2
    assert "a regression model's calibration gives intervals; add --interval LEVEL" in capsys.readouterr().err
    assert main_predict([*common, "--calibration_path", str(tmp_path / "missing.csv"), "--interval", "0.9"]) == 2
    assert f"--calibration_path {tmp_path / 'missing.csv'} does not exist" in capsys.readouterr().err
    np.savez(tmp_path / "f.npz", features=np.zeros((26, 200)))
    np.savez(tmp_path / "narrow.npz", features=np.zeros((26, 3)))
    with_features = [*common, "--features_path", str(tmp_path / "f.npz"), "--calibration_path", str(REG_DATA),
                     "--interval", "0.9"]
    assert main_predict(with_features) == 2
    assert "so the calibration file needs its own feature rows: add --calibration_features_path" \
        in capsys.readouterr().err
    assert main_predict([*with_features, "--calibration_features_path", str(tmp_path / "narrow.npz")]) == 2
    assert "--calibration_features_path has 3 features per row and --features_path 200" in capsys.readouterr().err
    assert main_predict([*common, "--calibration_features_path", str(tmp_path / "f.npz")]) == 2
    assert "--calibration_features_path holds the features of --calibration_path's rows: give both" \
        in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()


def test_calibration_file_too_few_labels_or_one_class_is_a_one_line_error(tmp_path, capsys):
    few = pd.read_csv(REG_DATA)
    few.loc[10:, "t2"] = np.nan
    few.to_csv(tmp_path / "few.csv", index=False)
    common = ["--data_path", str(REG_DATA), "--output_path", str(tmp_path / "p.csv")]
    assert main_predict([*common, "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"), "--calibration_path",
                         str(tmp_path / "few.csv"), "--interval", "0.9"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert f"--calibration_path {tmp_path / 'few.csv'}: column 't2' has {few['t2'].notna().sum()} labelled " \
           "molecule(s) with a valid SMILES; a calibration needs at least 20" in error
    one_class = pd.read_csv(CLS_DATA).assign(c2=1)
    one_class.to_csv(tmp_path / "one.csv", index=False)
    assert main_predict([*common, "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_cls.pt"), "--calibration_path",
                         str(tmp_path / "one.csv")]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert f"--calibration_path {tmp_path / 'one.csv'}: column 'c2': every labelled molecule is class 1" in error
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.slow  # a moto server and a Ray session of its own (the workers must see the S3 endpoint): ~40 s
def test_calibration_path_and_model_in_object_storage(tmp_path):
    """A model and a calibration file in the bucket: the model is downloaded, the calibration file is streamed by
    Ray Data's read tasks (as --data_path is); the intervals equal those of the same files on disk."""
    import os
    import subprocess
    import sys

    from tests.s3_server import BUCKET, MotoS3

    server = MotoS3(tmp_path / "s3").start()
    try:
        fs = server.filesystem()
        for name, source in (("model.pt", FIXTURE_DIR / "ckpt_ft_reg.pt"), ("assay.csv", REG_DATA)):
            with fs.open_output_stream(f"{BUCKET}/in/{name}") as stream:
                stream.write(source.read_bytes())
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **server.env(),
               "KERMT_CACHE": str(tmp_path / "cache")}
        args = ["--data_path", str(REG_DATA), "--interval", "0.9", "--drop_extra_columns"]
        commands = [["predict", *args, "--checkpoint_path", f"s3://{BUCKET}/in/model.pt", "--calibration_path",
                     f"s3://{BUCKET}/in/assay.csv", "--output_path", str(tmp_path / "remote.csv")],
                    ["predict", *args, "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"),
                     "--calibration_path", str(REG_DATA), "--output_path", str(tmp_path / "local.csv")]]
        done = subprocess.run([sys.executable, "-m", "tests.ray_app.cli_session", json.dumps(commands)],
                              cwd=FIXTURE_DIR.parents[2], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    finally:
        server.stop()
    assert f"calibrated on --calibration_path s3://{BUCKET}/in/assay.csv (t1 26, t2 24" in done.stderr
    remote, local = pd.read_csv(tmp_path / "remote.csv"), pd.read_csv(tmp_path / "local.csv")
    assert list(remote.columns) == ["smiles", "t1", "t2", "t1_lower", "t1_upper", "t2_lower", "t2_upper", "valid",
                                    "error"]
    pd.testing.assert_frame_equal(remote, local)
