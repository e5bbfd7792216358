"""`kermt finetune --calibration_path FILE`: every fold calibrated on a labelled file instead of its validation
split; bad files are one-line errors before anything trains; a re-run with only another calibration setting
recalibrates the trained members instead of training them again. ``--class_calibration_method isotonic``."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from kermt.checkpoint import load_finetune_model, read_checkpoint
from kermt.chem.standardize import MoleculePrep
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from kermt.errors import UserError
from kermt.train.step import predict
from kermt.uncertainty import fit_calibration, load_calibrations, load_class_calibrations
from kermt.uncertainty.classification import fit_class_calibrations
from ray_app.cli import main
from tests.conftest import FIXTURE_DIR
from tests.ray_app.finetune.tiny_runs import DEMO, tiny_finetune

TASKS = ["logp", "tpsa_100", "fsp3"]


def _demo_rows(path, rows: slice, transform=None):
    frame = pd.read_csv(DEMO).iloc[rows]
    frame = transform(frame) if transform else frame
    frame.to_csv(path, index=False)
    return path


def _classes(frame: pd.DataFrame) -> pd.DataFrame:
    """One binary task: whether logP is above 3 (both classes are common in the demo molecules)."""
    labelled = frame.dropna(subset=["logp"])
    return pd.DataFrame({"smiles": labelled["smiles"], "lipophilic": (labelled["logp"] > 3).astype(int)})


@pytest.mark.parametrize("make, dataset_type, message", [
    (lambda f: f.drop(columns=["fsp3"]), None, r"calib.csv: no column 'fsp3'"),
    (lambda f: f.head(15), None, r"--calibration_path .*calib.csv: column 'logp' has \d+ labelled molecule\(s\); "
     r"a calibration needs at least 20 per task"),
    (lambda f: _classes(f).assign(lipophilic=1), "classification",
     r"--calibration_path .*calib.csv: column 'lipophilic': every labelled molecule is class 1; a classification "
     r"calibration needs both classes"),
])
def test_a_bad_calibration_file_is_a_one_line_error_before_anything_trains(tmp_path, capsys, make, dataset_type,
                                                                           message):
    data = _demo_rows(tmp_path / "data.csv", slice(0, 60), _classes if dataset_type else None)
    calib = _demo_rows(tmp_path / "calib.csv", slice(200, 260), make)
    save_dir = tmp_path / "run"
    argv = ["finetune", "--data_path", str(data), "--calibration_path", str(calib), "--save_dir", str(save_dir),
            "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"), "--epochs", "1",
            *(["--dataset_type", dataset_type] if dataset_type else [])]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("kermt finetune: error: ")
    assert re.search(message, error[0]), error[0]
    assert not save_dir.exists()  # refused before Ray started, let alone training


def test_calibration_features_need_the_calibration_file():
    from ray_app.finetune.config import FinetuneConfig

    with pytest.raises(ValueError, match="calibration_features_path needs calibration_path"):
        FinetuneConfig(data_path="d.csv", calibration_features_path=["c.npz"])
    with pytest.raises(ValueError, match="calibration_path with features_path needs calibration_features_path"):
        FinetuneConfig(data_path="d.csv", features_path=["f.npz"], calibration_path="c.csv")


def _member_predictions(save_dir, smiles: list[str], members: int, batch_size: int = 16) -> np.ndarray:
    """[K, N, T] each saved member's predictions of ``smiles`` in label units, as the finetune makes them: each
    molecule standardised as the member records (every new finetune's parent: a carboxylate is its acid)."""
    found = []
    for member in range(members):
        checkpoint = read_checkpoint(save_dir / "fold_0" / f"model_{member}" / "model")
        done = featurize_smiles(smiles, prep=MoleculePrep(checkpoint.spec.features.standardize))
        molecules = MoleculeSet(done.graphs, None, np.zeros((len(smiles), 1), np.float32), done.smiles)
        model, _ = load_finetune_model(checkpoint)
        preds = predict(model, molecules, np.arange(len(smiles)), batch_size)
        scaler = checkpoint.spec.data_scaler
        found.append(scaler.inverse_transform(preds) if scaler is not None else preds)
    return np.stack(found)


@pytest.mark.slow  # two one-epoch finetunes of 2 members and a recalibration: ~2-4 min on the 2-core dev machine
def test_every_fold_is_calibrated_on_the_file_and_a_new_calibration_setting_only_recalibrates(ray_cluster,
                                                                                              tmp_path):
    data = _demo_rows(tmp_path / "data.csv", slice(0, 60))
    # 60 molecules the model never saw, and the first 4 of its data file (those of them in fold 0's training split
    # are counted by the warning)
    frame = pd.concat([pd.read_csv(DEMO).iloc[200:260], pd.read_csv(data).iloc[:4]])
    calib = tmp_path / "calib.csv"
    frame.to_csv(calib, index=False)
    save_dir = tmp_path / "run"
    flags = ("--ensemble_size", "2", "--calibration_path", str(calib))
    _, printed = tiny_finetune(save_dir, data, *flags)
    seen = len({0, 1, 2, 3} & set(json.loads((save_dir / "splits.json").read_text())["fold_0"]["train"]))
    assert seen > 0  # seed 0's random split puts some of the first rows in train
    assert (f"warning: --calibration_path {calib}: {seen} of its 64 molecules are also in the training data "
            f"(fold 0: {seen})") in printed
    source = f"--calibration_path {calib} (64 molecules)"
    assert f"fold 0: calibrated (normalised conformal) on {source}" in printed

    members = _member_predictions(save_dir, frame["smiles"].tolist(), 2)
    mu, sigma = members.mean(axis=0), members.std(axis=0)
    saved = load_calibrations(str(save_dir / "fold_0" / "calibration.json"))
    for t, task in enumerate(TASKS):
        by_hand = fit_calibration(task, mu[:, t], frame[task].to_numpy(float), sigma[:, t], "normalised", source)
        assert saved[task].n == by_hand.n == frame[task].notna().sum()
        np.testing.assert_allclose(saved[task].scores, by_hand.scores, rtol=1e-5)
    record = json.loads((save_dir / "run.json").read_text())
    fold = record["calibration"]["fold_0"]
    assert fold["source"] == source and fold["in_training_split"] == seen and fold["method"] == "normalised"
    assert json.loads((save_dir / "fold_0" / "calibration.json").read_text())["source"] == f"{source}, 2 member(s)"

    weights = save_dir / "fold_0" / "model_1" / "model" / "model.safetensors"
    trained_at = weights.stat().st_mtime_ns
    _, printed = tiny_finetune(save_dir, data, *flags, "--calibration_method", "plain")
    assert "finished before with these settings: the models it saved are kept and calibrated again" in printed
    assert "kept 2 of 2 model(s)" in printed and weights.stat().st_mtime_ns == trained_at  # not trained again
    plain = load_calibrations(str(save_dir / "fold_0" / "calibration.json"))
    expected = np.sort(np.abs(frame["logp"].to_numpy(float) - mu[:, 0])[frame["logp"].notna().to_numpy()])
    np.testing.assert_allclose(plain["logp"].scores, expected, rtol=1e-5)
    record = json.loads((save_dir / "run.json").read_text())
    assert record["calibration"]["fold_0"]["method"] == "plain"
    assert record["settings"]["calibration_method"]["value"] == "plain"


@pytest.mark.slow  # a one-epoch classification finetune of 2 members: ~1-2 min on the 2-core dev machine
def test_isotonic_classification_calibration_on_the_file(ray_cluster, tmp_path):
    data = _demo_rows(tmp_path / "data.csv", slice(0, 80), _classes)
    calib = _demo_rows(tmp_path / "calib.csv", slice(300, 420), _classes)
    save_dir = tmp_path / "run"
    _, printed = tiny_finetune(save_dir, data, "--dataset_type", "classification", "--ensemble_size", "2",
                               "--calibration_path", str(calib), "--class_calibration_method", "isotonic")
    assert "fold 0: calibrated (isotonic probabilities, conformal sets) on --calibration_path" in printed
    assert "warning: --calibration_path" not in printed  # no molecule of the file is in the training data
    frame = pd.read_csv(calib)
    # the file's one salt form (demo row 377, a penicillin's carboxylate), scored as its parent acid
    assert [s for s in featurize_smiles(frame["smiles"].tolist(), prep=MoleculePrep("parent")).model_smiles if s] == [
        "Cc1onc(-c2ccccc2)c1C(=O)NC1C(=O)N2C1SC(C)(C)C2C(=O)O"]
    labels = frame[["lipophilic"]].to_numpy(float)
    members = _member_predictions(save_dir, frame["smiles"].tolist(), 2)
    by_hand = fit_class_calibrations(["lipophilic"], members, labels, "isotonic")["lipophilic"]
    saved = load_class_calibrations(str(save_dir / "fold_0" / "classification_calibration.json"))["lipophilic"]
    assert saved.method == "isotonic" and saved.n == len(frame)
    np.testing.assert_allclose(saved.scores, by_hand.scores, atol=1e-6)
    p = members.mean(axis=0)[:, 0]
    np.testing.assert_allclose(saved.calibrated(p), by_hand.calibrated(p), atol=1e-5)
    record = json.loads((save_dir / "run.json").read_text())
    assert record["calibration"]["fold_0"]["method"] == "isotonic"
    assert record["settings"]["class_calibration_method"] == {"value": "isotonic", "source": "user"}


def test_invalid_smiles_that_leave_too_few_rows_are_an_error_before_training(ray_cluster, tmp_path):
    data = _demo_rows(tmp_path / "data.csv", slice(0, 40))
    frame = pd.read_csv(DEMO).iloc[200:400]
    frame = frame[frame[TASKS].notna().all(axis=1)].head(21).copy()
    frame.iloc[:3, 0] = "not_a_smiles"  # 21 labelled rows before featurisation, 18 valid molecules after
    frame.to_csv(tmp_path / "calib.csv", index=False)
    with pytest.raises(UserError, match=r"calib.csv: column 'logp' has 18 labelled molecule\(s\) with a valid "
                                        r"SMILES; a calibration needs at least 20"):
        tiny_finetune(tmp_path / "run", data, "--calibration_path", str(tmp_path / "calib.csv"))
    assert not (tmp_path / "run").exists()
