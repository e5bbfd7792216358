"""Finding a run's calibration: one fold's file, every fold's pooled, none (a model trained before), a missing task."""

from __future__ import annotations

import numpy as np
import pytest

from kermt.errors import UserError
from kermt.uncertainty import fit_calibration, save_calibrations
from kermt.uncertainty.run_calibration import calibration_files, run_calibration


def _fold(run, fold: int, seed: int, tasks=("a",)) -> None:
    rng = np.random.default_rng(seed)
    mu, sigma = rng.normal(size=30), 0.5 + rng.random(30)
    y = mu + sigma * rng.normal(size=30)
    (run / f"fold_{fold}").mkdir(parents=True)
    save_calibrations(str(run / f"fold_{fold}" / "calibration.json"),
                      {t: fit_calibration(t, mu, y, sigma) for t in tasks}, source=f"fold_{fold}")


def test_folds_are_pooled(tmp_path):
    _fold(tmp_path, 0, seed=0)
    _fold(tmp_path, 1, seed=1)
    pooled = run_calibration(tmp_path, ("a",))["a"]
    single = [run_calibration(tmp_path / f"fold_{f}", ("a",))["a"] for f in (0, 1)]
    assert pooled.n == 60 and list(pooled.scores) == sorted(single[0].scores + single[1].scores)
    assert pooled.z_scale == pytest.approx(np.sqrt((single[0].z_scale ** 2 + single[1].z_scale ** 2) / 2))


def test_no_calibration_and_a_missing_task(tmp_path):
    assert run_calibration(tmp_path, ("a",)) is None  # a model trained before calibration existed
    _fold(tmp_path, 0, seed=0)
    (tmp_path / "fold_1").mkdir()  # a fold that was not calibrated: the run has no calibration as a whole
    assert calibration_files(tmp_path) is None
    (tmp_path / "fold_1").rmdir()
    with pytest.raises(UserError, match=r"fold_0/calibration.json has no entry for task\(s\) \['b'\]"):
        run_calibration(tmp_path, ("a", "b"))
