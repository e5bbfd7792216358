"""The last step of a finetune fold: its ensemble calibrated on the fold's validation split, or on the labelled
file of ``--calibration_path`` (the same file for every fold, its features scaled as each fold's training data).

The members' mean is the prediction (``mu``), their total std is ``sigma`` (population spread, plus the predicted
variances of variance heads, :func:`kermt.uncertainty.total_std`: what `kermt predict --uncertainty` writes as
``<task>_std``), so the calibration describes exactly the intervals predict will serve. Normalised conformal by
default; with one plain member per fold the spread is 0 and the fold falls back to plain conformal (one
variance-head member has its own sigma and keeps the chosen method). A classification fold gets Platt scaling
(or isotonic, ``--class_calibration_method``) of its members' mean probability and the scores of conformal
prediction sets (``classification_calibration.json``, kermt.uncertainty.classification). A fold whose validation
split is too small (or has one class) is reported in one line and recorded in run.json, never a failed run: the
models are trained and usable without intervals. A calibration file that small is an error before training
(ray_app.finetune.inputs.check_calibration_labels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kermt.data.dataset import MoleculeSet
from kermt.data.scalers import StandardScaler
from kermt.errors import UserError
from kermt.inference.columns import ensemble_mean
from kermt.run_layout import IN_TRAINING_SPLIT_KEY, fold_name
from kermt.uncertainty import fit_calibration, intervals, save_calibrations, total_std
from kermt.uncertainty.calibration_file import save_class_calibrations
from kermt.uncertainty.classification import class_calibration_record, fit_class_calibrations
from kermt.uncertainty.conformal import MONDRIAN_DOMAIN
from ray_app.finetune.inputs import check_calibration_labels
from ray_app.finetune.prepare import ScaledSplits, SourceData, load_source, scaled_set
from ray_app.finetune.run_setup import RunSetup

PLAIN_FALLBACK = "plain"
REPORTED_LEVEL = 0.9  # the level whose validation coverage and width run.json records


def is_calibrated(setup: RunSetup) -> bool:
    """Whether the run's folds are calibrated (the validation predictions are made only then): regression and
    binary classification both are."""
    return setup.dataset_type in ("regression", "classification")


@dataclass(frozen=True)
class CalibrationSet:
    """The labelled molecules a fold's ensemble is calibrated on. ``molecules``: as the fold's model reads them
    (features scaled with the fold's scaler); ``labels`` [N, T] in label units (NaN: unlabelled); ``source``: what
    they are (calibration.json and run.json record it); ``in_training``: how many of them are also in the fold's
    training split (None for the validation split, which never is)."""

    molecules: MoleculeSet | None  # None: the fold's validation split, read from its shards
    labels: np.ndarray
    source: str
    in_training: int | None = None


def validation_set(fold: int, splits: ScaledSplits) -> CalibrationSet:
    """The fold's validation split, its labels back in label units."""
    return CalibrationSet(splits.val, label_units(splits.val.targets, splits.target_scaler),
                          validation_source(fold))


def validation_source(fold: int) -> str:
    return f"{fold_name(fold)} validation split"


def label_units(targets: np.ndarray, target_scaler: StandardScaler | None) -> np.ndarray:
    """float64 labels of a split whose targets the fold's model reads (scaled, for regression)."""
    return target_scaler.inverse_transform(targets) if target_scaler else np.asarray(targets, dtype=np.float64)


def load_calibration_file(setup: RunSetup) -> SourceData | None:
    """``--calibration_path`` read with the run's readers and featurised like the training data (on the cluster,
    as the data file is); its labelled valid molecules checked again, before any training. None without the flag."""
    c = setup.config
    if not c.calibration_path:
        return None
    source = load_source(c.calibration_path, c, setup.task_names, c.calibration_features_path)
    check_calibration_labels(c.calibration_path, source.targets, setup.task_names, setup.dataset_type,
                             note=" with a valid SMILES")
    width, data_width = source.featurized.features.shape[1], setup.data.featurized.features.shape[1]
    if width != data_width:
        raise UserError(f"--calibration_features_path {c.calibration_features_path}: {width} molecule feature "
                        f"columns, and --features_path gives the training data {data_width}")
    return source


def file_set(source: SourceData, features_scaler: StandardScaler | None, in_training: int) -> CalibrationSet:
    """The calibration file's molecules for one fold: features scaled with the fold's scaler, labels raw;
    ``in_training``: how many of them the fold's training split holds (counted where the folds are cut)."""
    molecules = scaled_set(source.featurized, source.targets, features_scaler)
    return CalibrationSet(molecules, np.asarray(source.targets, dtype=np.float64),
                          f"--calibration_path {source.path} ({len(source)} molecules)", in_training)


def in_training_split(smiles: Sequence[str], train_smiles: Sequence[str]) -> np.ndarray:
    """Which of ``smiles`` also appear (as the same SMILES string) among ``train_smiles``."""
    train = set(train_smiles)
    return np.array([s in train for s in smiles], dtype=bool)


def overlap_line(source: SourceData, per_fold: list[np.ndarray]) -> str | None:
    """One warning line when molecules of the calibration file are in a fold's training split (``per_fold``: each
    fold's :func:`in_training_split` mask), else None."""
    anywhere = np.logical_or.reduce(per_fold) if per_fold else np.zeros(len(source), dtype=bool)
    if not anywhere.any():
        return None
    folds = ", ".join(f"fold {k}: {int(mask.sum())}" for k, mask in enumerate(per_fold))
    return (f"warning: --calibration_path {source.path}: {int(anywhere.sum())} of its {len(source)} molecules are "
            f"also in the training data ({folds}); the model has seen them, so intervals calibrated on them come "
            "out too narrow: calibrate on molecules it never trained on")


def needs_distance(setup: RunSetup) -> bool:
    """Whether the run's calibration conditions on the applicability-domain distance (``mondrian_domain``)."""
    return setup.dataset_type == "regression" and setup.config.calibration_method == MONDRIAN_DOMAIN


def calibrate_fold(setup: RunSetup, fold: int, on: CalibrationSet, member_preds: list[np.ndarray],
                   member_variances: list[np.ndarray | None] | None = None,
                   distances: np.ndarray | None = None) -> dict[str, Any]:
    """Fit and save ``fold_F/calibration.json``; returns the fold's record for run.json. ``on``: the molecules
    calibrated on (the fold's validation split, :func:`validation_set`, or the --calibration_path file's,
    :func:`file_set`); ``member_preds``: each member's predictions of them; ``member_variances``: each member's
    predicted variances in label units (None for a plain member; None: all plain); ``distances``: the molecules'
    applicability-domain distances (:func:`needs_distance`; None: the fold has no domain index)."""
    if not is_calibrated(setup):
        return _skipped(setup, fold, on, f"{setup.dataset_type} models are not calibrated")
    if setup.dataset_type == "classification":
        return _calibrate_classes(setup, fold, on, member_preds)
    members = np.stack(member_preds)  # [K, N, T]
    variances = _stacked_variances(members, member_variances)
    mu, sigma = ensemble_mean(members), total_std(members, variances)
    method = setup.config.calibration_method if len(member_preds) > 1 or variances is not None else PLAIN_FALLBACK
    try:
        fitted = {task: fit_calibration(task, mu[:, t], on.labels[:, t], sigma[:, t], method, on.source, distances,
                                        _split_flag(setup, on))
                  for t, task in enumerate(setup.task_names)}
    except UserError as error:
        return _skipped(setup, fold, on, str(error))
    if method == PLAIN_FALLBACK:
        print(f"fold {fold}: one model per fold has no spread, so its intervals use plain conformal (one width for "
              "every molecule); train --ensemble_size 2 or more for intervals that adapt per molecule", flush=True)
    path = setup.layout.calibration(fold)
    save_calibrations(str(path), fitted, source=f"{on.source}, {len(member_preds)} member(s)")
    record = _record(setup, path, method, on)
    for t, (task, calibration) in enumerate(fitted.items()):
        lower, upper = intervals(calibration, mu[:, t], sigma[:, t], REPORTED_LEVEL, distances)
        record["tasks"][task] = {"n": calibration.n, "z_scale": calibration.z_scale,
                                 f"width_{REPORTED_LEVEL}": float(np.nanmean(upper - lower))}
    print(f"fold {fold}: calibrated ({method} conformal) on {on.source}: " + ", ".join(
        f"{task} n={v['n']} mean {REPORTED_LEVEL:.0%} width {v[f'width_{REPORTED_LEVEL}']:.4g}"
        for task, v in record["tasks"].items()), flush=True)
    return record


def _calibrate_classes(setup: RunSetup, fold: int, on: CalibrationSet, member_preds: list[np.ndarray]) \
        -> dict[str, Any]:
    """``fold_F/classification_calibration.json`` from the members' probabilities [K, N, T] of ``on``."""
    probs, method = np.stack(member_preds), setup.config.class_calibration_method
    try:
        fitted = fit_class_calibrations(setup.task_names, probs, on.labels, method, on.source, _split_flag(setup, on))
    except UserError as error:
        return _skipped(setup, fold, on, str(error))
    path = setup.layout.class_calibration(fold)
    save_class_calibrations(str(path), fitted, f"{on.source}, {len(member_preds)} member(s)")
    record = _record(setup, path, method, on)
    record["tasks"] = class_calibration_record(fitted, ensemble_mean(probs), on.labels, REPORTED_LEVEL)
    print(f"fold {fold}: calibrated ({method} probabilities, conformal sets) on {on.source}: "
          + ", ".join(f"{task} n={entry['n']}" for task, entry in record["tasks"].items()), flush=True)
    return record


def _split_flag(setup: RunSetup, on: CalibrationSet) -> str | None:
    """The flag that sizes ``on`` in this run's command, for a calibration's advice (None: a file of its own)."""
    return setup.config.split_flag if on.in_training is None else None


def _record(setup: RunSetup, path, method: str, on: CalibrationSet) -> dict[str, Any]:
    """The start of a calibrated fold's run.json record: its file, method and what it was fitted on."""
    record: dict[str, Any] = {"file": str(path.relative_to(setup.save_dir)), "method": method, "source": on.source,
                              "tasks": {}}
    if on.in_training is not None:
        record[IN_TRAINING_SPLIT_KEY] = on.in_training
    return record


def _stacked_variances(members: np.ndarray, member_variances: list[np.ndarray | None] | None) -> np.ndarray | None:
    """[K, N, T] variances (0 for a plain member among variance heads), or None when no member predicts one."""
    if member_variances is None or all(v is None for v in member_variances):
        return None
    return np.stack([np.zeros_like(m) if v is None else v for m, v in zip(members, member_variances)])


def _skipped(setup: RunSetup, fold: int, on: CalibrationSet, reason: str) -> dict[str, Any]:
    """A fold left uncalibrated: one line, the reason for run.json, and no calibration file of an earlier
    calibration of the same models left behind (a re-run with other calibration settings recalibrates)."""
    for path in (setup.layout.calibration(fold), setup.layout.class_calibration(fold)):
        path.unlink(missing_ok=True)
    print(f"fold {fold}: no calibration ({reason}); its models predict, but not with --interval", flush=True)
    return {"file": None, "source": on.source, "reason": reason}


__all__ = ["CalibrationSet", "calibrate_fold", "file_set", "in_training_split", "is_calibrated", "label_units",
           "load_calibration_file", "needs_distance", "overlap_line", "validation_set", "validation_source"]
