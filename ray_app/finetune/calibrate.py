"""The last step of a finetune fold: its ensemble calibrated on the fold's validation split.

The members' mean is the prediction (``mu``), their total std is ``sigma`` (population spread, plus the predicted
variances of variance heads, :func:`kermt.uncertainty.total_std`: what `kermt predict --uncertainty` writes as
``<task>_std``), so the calibration describes exactly the intervals predict will serve. Normalised conformal by
default; with one plain member per fold the spread is 0 and the fold falls back to plain conformal (one
variance-head member has its own sigma and keeps the chosen method). A classification fold gets Platt scaling of
its members' mean probability and the scores of conformal prediction sets (``classification_calibration.json``,
kermt.uncertainty.classification). A fold whose validation split is too small (or has one class) is reported in
one line and recorded in run.json, never a failed run: the models are trained and usable without intervals.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kermt.errors import UserError
from kermt.run_layout import CALIBRATION_FILE, CLASS_CALIBRATION_FILE
from kermt.uncertainty import fit_calibration, intervals, save_calibrations, total_std
from kermt.uncertainty.calibration_file import save_class_calibrations
from kermt.uncertainty.classification import (DEFAULT_CLASSIFICATION_METHOD, class_calibration_record,
                                              fit_class_calibrations)
from ray_app.finetune.members import member_test_predictions_with_variance
from ray_app.finetune.prepare import ScaledSplits
from ray_app.finetune.run_setup import RunSetup

PLAIN_FALLBACK = "plain"
REPORTED_LEVEL = 0.9  # the level whose validation coverage and width run.json records


def is_calibrated(setup: RunSetup) -> bool:
    """Whether the run's folds are calibrated (the validation predictions are made only then): regression and
    binary classification both are."""
    return setup.dataset_type in ("regression", "classification")


def member_val_predictions(model, splits: ScaledSplits, batch_size: int, use_gpu: bool, precision: str) \
        -> tuple[np.ndarray, np.ndarray | None]:
    """(n_val, n_tasks) predictions in label units, made exactly as the test predictions are, and a variance
    head's predicted variances (None without one)."""
    return member_test_predictions_with_variance(model, replace(splits, test=splits.val), batch_size, use_gpu,
                                                 precision)


def calibrate_fold(setup: RunSetup, fold: int, splits: ScaledSplits, member_preds: list[np.ndarray],
                   member_variances: list[np.ndarray | None] | None = None) -> dict[str, Any]:
    """Fit and save ``fold_F/calibration.json``; returns the fold's record for run.json. ``member_variances``: each
    member's predicted variances in label units (None for a plain member; None: all plain)."""
    if not is_calibrated(setup):
        return _skipped(fold, f"{setup.dataset_type} models are not calibrated")
    if setup.dataset_type == "classification":
        return _calibrate_classes(setup, fold, splits, member_preds)
    members = np.stack(member_preds)  # [K, N, T]
    variances = _stacked_variances(members, member_variances)
    mu, sigma = members.mean(axis=0), total_std(members, variances)
    labels = splits.target_scaler.inverse_transform(splits.val.targets) if splits.target_scaler else \
        np.asarray(splits.val.targets, dtype=np.float64)
    method = setup.config.calibration_method if len(member_preds) > 1 or variances is not None else PLAIN_FALLBACK
    source = f"fold_{fold} validation split"
    try:
        fitted = {task: fit_calibration(task, mu[:, t], labels[:, t], sigma[:, t], method, source)
                  for t, task in enumerate(setup.task_names)}
    except UserError as error:
        return _skipped(fold, str(error))
    if method == PLAIN_FALLBACK:
        print(f"fold {fold}: one model per fold has no spread, so its intervals use plain conformal (one width for "
              "every molecule); train --ensemble_size 2 or more for intervals that adapt per molecule", flush=True)
    path = setup.save_dir / f"fold_{fold}" / CALIBRATION_FILE
    save_calibrations(str(path), fitted, source=f"{source}, {len(member_preds)} member(s)")
    record: dict[str, Any] = {"file": str(path.relative_to(setup.save_dir)), "method": method, "tasks": {}}
    for t, (task, calibration) in enumerate(fitted.items()):
        lower, upper = intervals(calibration, mu[:, t], sigma[:, t], REPORTED_LEVEL)
        record["tasks"][task] = {"n": calibration.n, "z_scale": calibration.z_scale,
                                 f"width_{REPORTED_LEVEL}": float(np.nanmean(upper - lower))}
    print(f"fold {fold}: calibrated ({method} conformal) on {source}: " + ", ".join(
        f"{task} n={v['n']} mean {REPORTED_LEVEL:.0%} width {v[f'width_{REPORTED_LEVEL}']:.4g}"
        for task, v in record["tasks"].items()), flush=True)
    return record


def _calibrate_classes(setup: RunSetup, fold: int, splits: ScaledSplits, member_preds: list[np.ndarray]) \
        -> dict[str, Any]:
    """``fold_F/classification_calibration.json`` from the members' validation probabilities [K, N, T]."""
    probs = np.stack(member_preds)
    labels = np.asarray(splits.val.targets, dtype=np.float64)
    source = f"fold_{fold} validation split"
    try:
        fitted = fit_class_calibrations(setup.task_names, probs, labels, DEFAULT_CLASSIFICATION_METHOD, source)
    except UserError as error:
        return _skipped(fold, str(error))
    path = setup.save_dir / f"fold_{fold}" / CLASS_CALIBRATION_FILE
    save_class_calibrations(str(path), fitted, f"{source}, {len(member_preds)} member(s)")
    tasks = class_calibration_record(fitted, probs.mean(axis=0), labels, REPORTED_LEVEL)
    print(f"fold {fold}: calibrated ({DEFAULT_CLASSIFICATION_METHOD} probabilities, conformal sets) on {source}: "
          + ", ".join(f"{task} n={entry['n']}" for task, entry in tasks.items()), flush=True)
    return {"file": str(path.relative_to(setup.save_dir)), "method": DEFAULT_CLASSIFICATION_METHOD, "tasks": tasks}


def _stacked_variances(members: np.ndarray, member_variances: list[np.ndarray | None] | None) -> np.ndarray | None:
    """[K, N, T] variances (0 for a plain member among variance heads), or None when no member predicts one."""
    if member_variances is None or all(v is None for v in member_variances):
        return None
    return np.stack([np.zeros_like(m) if v is None else v for m, v in zip(members, member_variances)])


def _skipped(fold: int, reason: str) -> dict[str, Any]:
    print(f"fold {fold}: no calibration ({reason}); its models predict, but not with --interval", flush=True)
    return {"file": None, "reason": reason}


__all__ = ["calibrate_fold", "is_calibrated", "member_val_predictions"]
