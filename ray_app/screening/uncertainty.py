"""What a `kermt predict / eval` adds to the ensemble's numbers, planned before Ray starts: the calibration of its
intervals or probabilities and the applicability domain (the columns themselves: :mod:`kermt.inference.columns`).

* Regression: each task's conformal calibration (``<task>_lower`` / ``<task>_upper`` with ``--interval``).
  Classification: each task's Platt/isotonic calibration (``<task>_calibrated``; with ``--interval`` the prediction
  set ``<task>_set``). Either comes from the run's fold files, or from ``--calibration_path``.
* ``--calibration_path FILE`` (CSV/Parquet, a SMILES column and one label column per task, and for a model given
  ``--features_path`` its own feature rows, ``--calibration_features_path``) recalibrates a trained model on the
  user's labelled molecules. Its columns are checked before Ray starts; once Ray is up the file is predicted by the
  screening pipeline itself (:func:`calibrated_on_file`), and each task's calibration is fitted on the driver and
  replaces the run's:

  - Where the predicting runs: the same Ray Data stream as `kermt predict` (read tasks, CPU featurise tasks, the
    ``PredictStage`` actor pool with ``--cpus_per_actor`` / ``--num_gpus_per_actor``), so it runs where the model's
    resources are and a cluster whose head has 0 CPUs (docs/cluster.md) works as it does for the prediction itself;
    the driver only receives the valid rows' means, spreads and labels (a few numbers per molecule). It is also the
    same Ensemble, batching (``--batch_size``), mean and total std (MC dropout included) as the served predictions,
    so the calibration describes exactly the intervals it serves. The price: the model is loaded by a second actor
    pool (seconds), which a separate Ray task would pay too.
  - Regression: :func:`kermt.uncertainty.fit_calibration` per task, with the run's method when it has a
    calibration, else the default; without a spread (one model, no MVE head, no MC dropout) plain conformal, as
    finetune does. Classification: :func:`kermt.uncertainty.fit_class_calibrations` (the run's method, else Platt).
  - Bad input is a one-line UserError naming the file and column before any output is written: too few labelled
    molecules for a task, one class only, a level the file is too small for. Invalid SMILES rows are skipped and
    counted.
* ``--applicability_domain``: the index of the ensemble's first fold, found and checked here, then fitted once per
  model actor (:class:`kermt.uncertainty.domain.DomainScorer`). The index travels to the actors with the members:
  Ray Data puts a stage's constructor arguments in the object store once, and each actor reads them once, in its
  constructor, where it also fits the scikit-learn index; a block costs member 0's encoder pass and one k-NN query.
  With several folds, predict's ensemble is every fold's members but the domain is fold 0's (its member 0's
  embedding, its training split): the one index whose embedding the actor computes. A ``mondrian_domain``
  calibration (one conformal quantile per distance bin) needs the same distance for every molecule it gives an
  interval, so the index is loaded for ``--interval`` with such a calibration too, its columns written only with the
  flag; recalibrating such a run on ``--calibration_path`` reads the file's distances through the same index.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from kermt.checkpoint import Checkpoint
from kermt.data.feature_files import load_features_files
from kermt.errors import UserError
from kermt.inference import task_names
from kermt.run_layout import CALIBRATION_FILE, CLASS_CALIBRATION_FILE
from kermt.uncertainty import (DEFAULT_METHOD, MIN_CALIBRATION_ROWS, Calibration, ClassCalibration,
                               fit_calibration, fit_class_calibrations)
from kermt.uncertainty.classification import DEFAULT_CLASSIFICATION_METHOD
from kermt.uncertainty.conformal import MONDRIAN_DOMAIN, PLAIN
from kermt.uncertainty.domain import DOMAIN_FILE, DomainIndex, run_domain
from kermt.uncertainty.run_calibration import (HOW_TO_CALIBRATE, calibration_files, run_calibration,
                                               run_class_calibration)
from ray_app.screening.config import ModelScreeningConfig, log
from ray_app.screening.files import InputTable, Source
from ray_app.screening.labelled import LabelledRows
from ray_app.screening.engines import predict_stream
from ray_app.screening.stream import drain

if TYPE_CHECKING:
    from ray_app.screening.plan import PredictPlan

DOMAIN_FLAG = "--applicability_domain"
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
    """``--calibration_path`` as checked before Ray starts: the file, its SMILES column and, for a model given
    ``--features_path``, its own feature rows (``--calibration_features_path``)."""

    table: InputTable
    smiles_column: str
    features: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def path(self) -> str:
        return self.table.path


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
        table = InputTable.open(path)
    except UserError as error:
        raise UserError(str(error).replace(f"data_path {path}", f"--calibration_path {path}", 1)) from error
    names = table.columns
    smiles = config.smiles_column or names[0]
    missing = [name for name in (smiles, *tasks) if name not in names]
    if missing:
        raise UserError(f"--calibration_path {path} has no column {missing[0]!r} (columns: {', '.join(names)}); it "
                        f"needs the SMILES column and one label column per task of the model ({', '.join(tasks)})")
    return CalibrationFile(table, smiles, _calibration_features(config, file_features))


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


def plan_domain(config: ModelScreeningConfig, members: list[Checkpoint],
                calibrations: dict[str, Calibration] | None = None) -> DomainIndex | None:
    """The index of members[0]'s fold when the flag is given or the intervals' calibration reads the distance
    (an error if it has none or it is another model's)."""
    needs = _needs_distance(config, calibrations, members)
    if not (config.applicability_domain or needs):
        return None
    flag = DOMAIN_FLAG if config.applicability_domain else f"--interval with a {MONDRIAN_DOMAIN} calibration"
    if config.checkpoint_dir is None:
        raise UserError(f"{flag} needs the finetune run: pass --checkpoint_dir with its --save_dir (each "
                        f"fold_k/ holds {DOMAIN_FILE}), not --checkpoint_path of one member")
    found = run_domain(config.checkpoint_dir, members[0])
    if found.index is None:
        raise UserError(f"{flag}: --checkpoint_dir {config.checkpoint_dir} has no applicability domain "
                        f"({found.why_not})")
    index = found.index
    log(f"applicability domain: {found.path}, {index.training.shape[0]} of {index.n_training_total} "
        f"training molecule(s), k={index.k}, in_domain = domain_distance <= {index.threshold:.4g} (as close as "
        f"{index.quantile:.0%} of the validation molecules)")
    return index


def _needs_distance(config: ModelScreeningConfig, calibrations: dict[str, Calibration] | None,
                    members: list[Checkpoint]) -> bool:
    """Whether the served intervals read the domain distance: the run's calibration, or the one --calibration_path
    will fit with the run's method, is ``mondrian_domain``."""
    if config.interval is None or members[0].spec.head.dataset_type != "regression":
        return False
    if config.calibration_path is not None:
        return _run_method(config, task_names(members[0].spec), False) == MONDRIAN_DOMAIN
    return bool(calibrations) and any(c.needs_distance for c in calibrations.values())


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
                                       method, source, rows.distance()) for i, t in enumerate(tasks)}
    for calibration in calibrations.values():
        calibration.quantile(config.interval)  # too small a file for the level: the error names the task
    log(f"{config.interval:.0%} intervals: {method} conformal, calibrated on {what}")
    return replace(checked, calibrations=calibrations)


def _predicted(config: ModelScreeningConfig, checked: PredictPlan) -> LabelledRows:
    """The ensemble's mean and total std of the calibration file's valid rows, with their labels."""
    tasks, file = task_names(checked.members[0].spec), checked.calibration_file
    path = file.path
    # the calibration needs the mean and std only: no attributions (about 40 predictions' work per molecule)
    distance = _needs_distance(config, None, checked.members)  # a mondrian_domain fit reads the file's distances
    plain = config.model_copy(update={"data_path": path, "uncertainty": True, "interval": None,
                                      "attributions": False, "applicability_domain": distance})
    plan = replace(checked, source=Source(file.table, file.smiles_column, ()), calibrations=None,
                   domain=checked.domain if distance else None,
                   class_calibrations=None, calibration_file=None, file_features=file.features)
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


__all__ = ["CalibrationFile", "DOMAIN_FLAG", "HOW_TO_RECALIBRATE", "calibrated_on_file", "check_calibration_file",
           "log_class_calibration", "plan_class_calibration", "plan_domain", "plan_intervals"]
