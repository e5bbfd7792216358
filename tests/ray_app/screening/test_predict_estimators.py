"""`kermt predict --uncertainty` of a variance-head (``--loss mve``) model, without and with ``--dropout_samples``:
the <task>_std columns equal the library's Ensemble (the total std), and MC dropout's flags are checked before Ray
starts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from kermt.inference import Ensemble, read_members
from tests.ray_app.screening.engines import main_predict
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference_estimators import _member, _molecules


def _library(path, molecules, dropout_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The library's numbers with one torch thread, as in the 1-CPU actors (the summation order depends on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prediction = Ensemble(read_members([path]), dropout_samples=dropout_samples).predict(molecules, 32)
    finally:
        torch.set_num_threads(threads)
    return prediction.mean, prediction.std


def test_predict_uncertainty_of_an_mve_model_equals_the_library(tmp_path, capsys):
    model = _member(tmp_path / "mve", seed=0, variance=True, dropout=0.2)
    molecules = _molecules()
    common = ["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--checkpoint_path", str(model), "--uncertainty"]
    for samples in (0, 3):
        out = tmp_path / f"preds_{samples}.csv"
        assert main_predict([*common, "--output_path", str(out), "--dropout_samples", str(samples)]) == 0
        frame = pd.read_csv(out)
        assert list(frame.columns) == ["smiles", "t1", "t2", "t1_std", "t2_std", "valid", "error"]
        mean, std = _library(model, molecules, samples)
        np.testing.assert_allclose(frame[["t1", "t2"]].to_numpy(float), mean, rtol=1e-12)
        np.testing.assert_allclose(frame[["t1_std", "t2_std"]].to_numpy(float), std, rtol=1e-12)
        assert (std > 0).all()
    assert "writes <task>_std = 0" not in capsys.readouterr().out  # one MVE model has its own spread


def test_mc_dropout_flags_are_checked_before_ray(tmp_path, capsys):
    common = ["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(tmp_path / "p.csv")]
    plain = _member(tmp_path / "plain", seed=0, variance=False, dropout=0.0)
    assert main_predict([*common, "--checkpoint_path", str(plain), "--dropout_samples", "3"]) != 0
    assert "trained with --dropout 0: MC dropout needs dropout > 0" in capsys.readouterr().err
    with_dropout = _member(tmp_path / "dropout", seed=0, variance=False, dropout=0.2)
    assert main_predict([*common, "--checkpoint_path", str(with_dropout), "--dropout_samples", "3",
                         "--interval", "0.9"]) != 0
    assert "--dropout_samples 3 with --interval 0.9" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()


def test_eval_of_a_calibrated_run_with_mc_dropout_scores_without_intervals(tmp_path, capsys):
    """A calibrated run is scored at 0.9 by default, but not with --dropout_samples: the calibration was fitted on
    the spread without MC dropout (asking for both is refused, above)."""
    from kermt.uncertainty import fit_calibration, save_calibrations
    from tests.ray_app.screening.engines import main_eval

    _member(tmp_path / "run" / "fold_0" / "model_0", seed=0, variance=False, dropout=0.2)
    rng = np.random.default_rng(0)
    fitted = {t: fit_calibration(t, np.zeros(40), rng.normal(size=40), None, method="plain") for t in ("t1", "t2")}
    save_calibrations(str(tmp_path / "run" / "fold_0" / "calibration.json"), fitted, source="synthetic")
    labelled = pd.read_csv(FIXTURE_DIR / "smiles.csv")
    labelled["t1"], labelled["t2"] = rng.normal(size=len(labelled)), rng.normal(size=len(labelled))
    labelled.to_csv(tmp_path / "labelled.csv", index=False)
    common = ["--data_path", str(tmp_path / "labelled.csv"), "--checkpoint_dir", str(tmp_path / "run")]
    assert main_eval([*common, "--output_path", str(tmp_path / "plain.csv")]) == 0
    assert "90% interval: coverage" in capsys.readouterr().out  # the calibrated default
    assert main_eval([*common, "--output_path", str(tmp_path / "mc.csv"), "--dropout_samples", "3"]) == 0
    assert "interval" not in capsys.readouterr().out
