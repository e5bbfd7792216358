"""``--calibration_path FILE`` on `kermt predict / eval`: recalibrate a trained model on the user's labelled molecules.

The file (CSV/Parquet, a SMILES column and one label column per task, and for a model given ``--features_path`` its
own rows of features, ``--calibration_features_path``; all checked before Ray starts,
ray_app.screening.calibration.check_calibration_file) is predicted by the screening pipeline itself, then each
task's calibration is fitted on the driver and replaces the run's for ``--interval`` and ``<task>_calibrated``:

* Where the predicting runs: the same Ray Data stream as `kermt predict` (read tasks, CPU featurise tasks, the
  ``PredictStage`` actor pool with ``--cpus_per_actor`` / ``--num_gpus_per_actor``), so it runs where the model's
  resources are and a cluster whose head has 0 CPUs (docs/cluster.md) works as it does for the prediction itself;
  the driver only receives the valid rows' means, spreads and labels (a few numbers per molecule). It is also the
  same Ensemble, batching (``--batch_size``), mean and total std (MC dropout included) as the served predictions,
  so the calibration describes exactly the intervals it serves. The price: the model is loaded by a second actor
  pool (seconds), which a separate Ray task would pay too.
* Regression: :func:`kermt.uncertainty.fit_calibration` per task, with the run's method when it has a calibration,
  else the default; without a spread (one model, no MVE head, no MC dropout) plain conformal, as finetune does.
  Classification: :func:`kermt.uncertainty.fit_class_calibrations` (the run's method, else Platt).
* Bad input is a one-line UserError naming the file and column before any output is written: too few labelled
  molecules for a task, one class only, a level the file is too small for. Invalid SMILES rows are skipped and
  counted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kermt.errors import UserError
from kermt.inference import task_names
from kermt.run_layout import CALIBRATION_FILE, CLASS_CALIBRATION_FILE
from kermt.uncertainty import (DEFAULT_METHOD, MIN_CALIBRATION_ROWS, Calibration, ClassCalibration,
                               fit_calibration, fit_class_calibrations)
from kermt.uncertainty.classification import DEFAULT_CLASSIFICATION_METHOD
from kermt.uncertainty.conformal import PLAIN
from kermt.uncertainty.run_calibration import calibration_files, run_calibration, run_class_calibration
from ray_app.screening.calibration import log_class_calibration
from ray_app.screening.config import ModelScreeningConfig, log
from ray_app.screening.labelled import LabelledRows
from ray_app.screening.run import PredictPlan, Source, predict_stream
from ray_app.screening.stream import drain


def calibrated_on_file(config: ModelScreeningConfig, checked: PredictPlan) -> PredictPlan:
    """``checked`` with each task's calibration fitted on ``--calibration_path`` (unchanged without the flag)."""
    if config.calibration_path is None:
        return checked
    rows = _predicted(config, checked)
    preds, targets = rows.arrays()
    spec = checked.members[0].spec
    tasks, source = task_names(spec), f"--calibration_path {config.calibration_path}"
    labelled = dict(zip(tasks, np.sum(~np.isnan(targets), axis=0).tolist()))
    for task, n in labelled.items():  # the library would say the same, with a hint about finetune's split sizes
        if n < MIN_CALIBRATION_ROWS:
            raise UserError(f"{source}: column {task!r} has {n} labelled molecule(s) with a valid SMILES; a "
                            f"calibration needs at least {MIN_CALIBRATION_ROWS}: add labelled molecules to the file")
    what = f"{source} ({', '.join(f'{t} {n}' for t, n in labelled.items())} labelled molecule(s))"
    if spec.head.dataset_type == "classification":
        classes = fit_class_calibrations(tasks, preds, targets, _run_method(config, tasks, True), source)
        log_class_calibration(classes, config.interval, what)
        return replace(checked, class_calibrations=classes)
    has_spread = len(checked.members) > 1 or bool(spec.head.variance) or bool(config.dropout_samples)
    method = _run_method(config, tasks, False) if has_spread else PLAIN
    spread = rows.spread() if has_spread else None
    calibrations = {t: fit_calibration(t, preds[:, i], targets[:, i], None if spread is None else spread[:, i],
                                       method, source) for i, t in enumerate(tasks)}
    for calibration in calibrations.values():
        calibration.quantile(config.interval)  # too small a file for the level: the error names the task
    log(f"{config.interval:.0%} intervals: {method} conformal, calibrated on {what}")
    return replace(checked, calibrations=calibrations)


def _predicted(config: ModelScreeningConfig, checked: PredictPlan) -> LabelledRows:
    """The ensemble's mean and total std of the calibration file's valid rows, with their labels."""
    tasks, file = task_names(checked.members[0].spec), checked.calibration_file
    path = file.path
    plain = config.model_copy(update={"data_path": path, "uncertainty": True, "interval": None})
    plan = replace(checked, source=Source(file.smiles_column, ()), calibrations=None, domain=None,
                   class_calibrations=None, file_features=file.features)
    rows = LabelledRows(path, tasks, tasks, checked.members[0].spec.head.dataset_type == "classification")
    try:
        stream = predict_stream(plain, plan, tasks)
    except UserError as error:  # the row count of the feature files is checked there, under predict's flag name
        raise UserError(str(error).replace("--features_path", "--calibration_features_path", 1)) from error
    stats = drain(stream, rows.add)
    if stats.valid == 0:
        raise UserError(f"--calibration_path: {stats.all_invalid_message(path)}")
    if stats.valid < stats.rows:
        log(f"--calibration_path {path}: {stats.rows - stats.valid} of {stats.rows} row(s) are not valid molecules "
            "and were skipped")
    return rows


def _run_method(config: ModelScreeningConfig, tasks: tuple[str, ...], classification: bool) -> str:
    """The method of the run's own calibration (so a recalibration changes the data, not the method), else the
    default."""
    name = CLASS_CALIBRATION_FILE if classification else CALIBRATION_FILE
    if config.checkpoint_dir is None or calibration_files(config.checkpoint_dir, name) is None:
        return DEFAULT_CLASSIFICATION_METHOD if classification else DEFAULT_METHOD
    found: dict[str, Calibration] | dict[str, ClassCalibration] | None = (
        run_class_calibration if classification else run_calibration)(config.checkpoint_dir, tasks)
    return next(iter(found.values())).method


__all__ = ["calibrated_on_file"]
