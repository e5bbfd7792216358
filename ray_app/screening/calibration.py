"""`kermt predict / eval --interval LEVEL`: the model's calibration, found and checked before Ray starts.

Regression: each task's conformal calibration (``<task>_lower`` / ``<task>_upper``). Classification: each task's
Platt/isotonic calibration (``<task>_calibrated``; with ``--interval`` the prediction set ``<task>_set``). From the
run's fold files, or, with ``--calibration_path``, fitted on the user's labelled file once Ray is up
(ray_app.screening.file_calibration); here only that file's columns are checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kermt.checkpoint import Checkpoint
from kermt.data.feature_files import load_features_files
from kermt.errors import UserError
from kermt.inference import task_names
from kermt.run_layout import CALIBRATION_FILE, CLASS_CALIBRATION_FILE
from kermt.uncertainty import Calibration, ClassCalibration
from kermt.uncertainty.run_calibration import (HOW_TO_CALIBRATE, calibration_files, run_calibration,
                                               run_class_calibration)
from ray_app.screening.config import ModelScreeningConfig, log
from ray_app.screening.files import column_names

HOW_TO_RECALIBRATE = ("--calibration_path FILE calibrates it on labelled molecules it did not train on (a SMILES "
                      "column and one label column per task)")


def plan_intervals(config: ModelScreeningConfig, members: list[Checkpoint]) -> dict[str, Calibration] | None:
    """Each regression task's calibration when ``--interval`` is given (an error if the model has none), else None
    (also for a classification model: :func:`plan_class_calibration`, and with ``--calibration_path``)."""
    if members[0].spec.head.dataset_type != "regression":
        return None
    if config.calibration_path is not None:
        if config.interval is None:
            raise UserError(f"--calibration_path {config.calibration_path}: a regression model's calibration "
                            "gives intervals; add --interval LEVEL (e.g. 0.9)")
        return None
    if config.interval is None:
        if config.uncertainty and (config.checkpoint_path or calibration_files(config.checkpoint_dir) is None):
            log("note: this model has no calibration: <task>_std is the members' raw spread, not a calibrated "
                "uncertainty")
        return None
    level = config.interval
    if config.checkpoint_dir is None:
        raise UserError(f"--interval {level} needs the calibrated ensemble: pass --checkpoint_dir with the "
                        f"--save_dir of a `kermt finetune` run (its folds hold {CALIBRATION_FILE}), not "
                        "--checkpoint_path of one member; or calibrate this model with --calibration_path FILE")
    calibrations = run_calibration(config.checkpoint_dir, task_names(members[0].spec))
    if calibrations is None:
        raise UserError(f"--interval {level}: --checkpoint_dir {config.checkpoint_dir} has no calibration (no "
                        f"{CALIBRATION_FILE} in it or in each fold_k/): it was trained before calibration existed "
                        f"or its validation split was too small; {HOW_TO_CALIBRATE}, or {HOW_TO_RECALIBRATE}")
    for calibration in calibrations.values():
        calibration.quantile(level)  # a level the calibration set is too small for fails here, not in an actor
    first = next(iter(calibrations.values()))
    log(f"{level:.0%} intervals: {first.method} conformal, calibrated on {first.n} validation molecule(s) per task")
    return calibrations


def plan_class_calibration(config: ModelScreeningConfig,
                           members: list[Checkpoint]) -> dict[str, ClassCalibration] | None:
    """A classification model's calibration from its run (folds pooled); None without one (a note, or with
    ``--interval`` an error that says how to calibrate), for a regression model and with ``--calibration_path``."""
    dataset_type = members[0].spec.head.dataset_type
    if dataset_type != "classification":
        if config.checkpoint_dir and calibration_files(config.checkpoint_dir, CLASS_CALIBRATION_FILE) is not None:
            raise UserError(f"--checkpoint_dir {config.checkpoint_dir} holds {CLASS_CALIBRATION_FILE}, but the model "
                            f"is {dataset_type}: remove that file")
        return None
    if config.calibration_path is not None:
        return None
    tasks = task_names(members[0].spec)
    calibrations = run_class_calibration(config.checkpoint_dir, tasks) if config.checkpoint_dir else None
    if calibrations is None:
        if config.interval is not None:
            raise UserError(f"--interval {config.interval}: this classification model has no calibration (no "
                            f"{CLASS_CALIBRATION_FILE} in --checkpoint_dir or in each fold_k/), so no prediction "
                            f"sets; {HOW_TO_RECALIBRATE}, or train it again with this kermt (`kermt finetune` "
                            "calibrates on the validation split)")
        log("note: this model has no classification calibration: <task> is the raw probability and there is no "
            f"<task>_calibrated; {HOW_TO_RECALIBRATE}")
        return None
    log_class_calibration(calibrations, config.interval, f"{next(iter(calibrations.values())).n} molecule(s) per task")
    return calibrations


def log_class_calibration(calibrations: dict[str, ClassCalibration], level: float | None, what: str) -> None:
    """Check ``level`` against each calibration's size (a UserError naming the task) and say what was calibrated."""
    method = next(iter(calibrations.values())).method
    if level is None:
        log(f"{method}-calibrated probabilities (<task>_calibrated), calibrated on {what}")
        return
    for calibration in calibrations.values():
        calibration.quantile(level)
    log(f"{level:.0%} prediction sets and {method}-calibrated probabilities, calibrated on {what}")


@dataclass(frozen=True)
class CalibrationFile:
    """``--calibration_path`` as checked before Ray starts: its SMILES column and, for a model given
    ``--features_path``, its own feature rows (``--calibration_features_path``)."""

    path: str
    smiles_column: str
    features: tuple[np.ndarray, np.ndarray] | None = None


def check_calibration_file(config: ModelScreeningConfig, tasks: tuple[str, ...],
                           file_features: tuple[np.ndarray, np.ndarray] | None) -> CalibrationFile | None:
    """``--calibration_path`` once its columns are known to hold every task (its SMILES column:
    ``--smiles_column``, else its first) and its feature files to match ``--features_path``'s; None without it."""
    path = config.calibration_path
    if path is None:
        if config.calibration_features_path:
            raise UserError("--calibration_features_path holds the features of --calibration_path's rows: give both")
        return None
    try:
        names = column_names(path)
    except UserError as error:
        raise UserError(str(error).replace(f"data_path {path}", f"--calibration_path {path}", 1)) from error
    smiles = config.smiles_column or names[0]
    missing = [name for name in (smiles, *tasks) if name not in names]
    if missing:
        raise UserError(f"--calibration_path {path} has no column {missing[0]!r} (columns: {', '.join(names)}); it "
                        f"needs the SMILES column and one label column per task of the model ({', '.join(tasks)})")
    return CalibrationFile(path, smiles, _calibration_features(config, file_features))


def _calibration_features(config: ModelScreeningConfig,
                          file_features: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray] | None:
    given = config.calibration_features_path
    if bool(given) != (file_features is not None):
        raise UserError(f"--calibration_path {config.calibration_path}: " + (
            "the model is given --features_path, so the calibration file needs its own feature rows: add "
            "--calibration_features_path FILE.npz" if file_features is not None else
            "--calibration_features_path is only for a model given --features_path (else the checkpoint's "
            "features_generator computes the calibration file's features)"))
    if not given:
        return None
    features = load_features_files(given)
    if features[0].shape[1] != file_features[0].shape[1]:
        raise UserError(f"--calibration_features_path has {features[0].shape[1]} features per row and "
                        f"--features_path {file_features[0].shape[1]}: give the same features for both files")
    return features
