"""The calibration of the ensemble a `kermt predict --checkpoint_dir` reads: its folds' ``calibration.json``.

A finetune run's ensemble is every member of every fold; each fold was calibrated on its own validation split
with its own members. With one fold (the default) that calibration is exactly the ensemble's. With several folds
the folds' scores are pooled (each validation molecule scored by its own fold's ensemble): the predicting ensemble
has more members than any fold's, so the pooled calibration is an approximation (CV+ is not implemented).
A classification model's ``classification_calibration.json`` files are found and pooled the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kermt.errors import UserError
from kermt.run_layout import CALIBRATION_FILE, CLASS_CALIBRATION_FILE
from kermt.uncertainty.calibration_file import load_calibrations, load_class_calibrations
from kermt.uncertainty.classification import PLATT, ClassCalibration
from kermt.uncertainty.conformal import Calibration

HOW_TO_CALIBRATE = ("train it again with this kermt: `kermt finetune` calibrates each fold's ensemble on its "
                    "validation split (at least 20 labelled molecules: see --split_sizes)")
HOW_TO_CALIBRATE_CLASSES = ("fit it again on labelled molecules the model did not train on, with both classes in "
                            "each task (kermt.uncertainty.fit_class_calibration)")


def calibration_files(checkpoint_dir: str | Path, file_name: str = CALIBRATION_FILE) -> list[Path] | None:
    """The calibration file of a fold directory, or of every fold of a run; None if any fold has none.
    ``file_name``: :data:`CLASS_CALIBRATION_FILE` for a classification model's."""
    root = Path(checkpoint_dir)
    if (root / file_name).is_file():
        return [root / file_name]
    folds = sorted((p for p in root.glob("fold_*") if p.is_dir() and re.fullmatch(r"fold_\d+", p.name)),
                   key=lambda p: int(p.name.split("_")[1]))
    files = [fold / file_name for fold in folds]
    return files if files and all(f.is_file() for f in files) else None


def run_calibration(checkpoint_dir: str | Path, tasks: tuple[str, ...]) -> dict[str, Calibration] | None:
    """Each task's calibration (folds pooled), or None when the model has none; a file without one of ``tasks``
    is an error naming it."""
    files = calibration_files(checkpoint_dir)
    if files is None:
        return None
    per_file = _with_tasks(files, [load_calibrations(str(f)) for f in files], tasks, "calibration file",
                           HOW_TO_CALIBRATE)
    return {task: pooled([c[task] for c in per_file]) for task in tasks}


def run_class_calibration(checkpoint_dir: str | Path,
                          tasks: tuple[str, ...]) -> dict[str, ClassCalibration] | None:
    """A classification model's :func:`run_calibration`: each task's Platt/isotonic calibration and set scores from
    its ``classification_calibration.json`` files (folds pooled), or None when it has none."""
    files = calibration_files(checkpoint_dir, CLASS_CALIBRATION_FILE)
    if files is None:
        return None
    per_file = _with_tasks(files, [load_class_calibrations(str(f)) for f in files], tasks,
                           "classification calibration file", HOW_TO_CALIBRATE_CLASSES)
    return {task: pooled_class([c[task] for c in per_file]) for task in tasks}


def _with_tasks(files: list[Path], per_file: list[dict], tasks: tuple[str, ...], what: str,
                how: str) -> list[dict]:
    for path, calibrations in zip(files, per_file):
        missing = [t for t in tasks if t not in calibrations]
        if missing:
            raise UserError(f"{what} {path} has no entry for task(s) {missing} of the model (it has "
                            f"{sorted(calibrations)}); {how}")
    return per_file


def _one_method(calibrations: list) -> None:
    if len({c.method for c in calibrations}) > 1:
        raise UserError(f"task {calibrations[0].task!r}: the folds were calibrated with different methods "
                        f"{sorted({c.method for c in calibrations})}; predict with one fold's directory")


def pooled(calibrations: list[Calibration]) -> Calibration:
    """One calibration from several folds' (same task and method): scores merged, floors and z-scales averaged
    (z-scales as a root mean square weighted by n, the fit on the pooled scores). A ``mondrian_domain`` fold's
    distances are to its own domain index, and predict reads fold 0's: pooled, they are an approximation too."""
    first = calibrations[0]
    if len(calibrations) == 1:
        return first
    _one_method(calibrations)
    rows = sorted((s, sigma, d) for c in calibrations
                  for s, sigma, d in zip(c.scores, c.sigmas or [0.0] * c.n, c.distances or [0.0] * c.n))
    scores = tuple(s for s, _, _ in rows)
    sigmas = tuple(sigma for _, sigma, _ in rows) if first.sigmas is not None else None
    distances = tuple(d for _, _, d in rows) if first.distances is not None else None
    n = np.array([c.n for c in calibrations], dtype=np.float64)
    zs = [c.z_scale for c in calibrations]
    z_scale = None if None in zs else float(np.sqrt(np.sum(n * np.square(zs)) / n.sum()))
    floors = [c.sigma_floor for c in calibrations]
    floor = None if None in floors else float(np.mean(floors))
    return Calibration(task=first.task, method=first.method, scores=scores, z_scale=z_scale, sigma_floor=floor,
                       sigmas=sigmas, distances=distances)


def pooled_class(calibrations: list[ClassCalibration]) -> ClassCalibration:
    """One calibration from several folds' (same task and method): set scores merged; Platt's ``a``/``b`` and the
    isotonic functions (on the union of their thresholds) averaged, weighted by each fold's ``n``. An approximation,
    as the regression pooling is: the predicting ensemble has more members than any fold's."""
    first = calibrations[0]
    if len(calibrations) == 1:
        return first
    _one_method(calibrations)
    weights = np.array([c.n for c in calibrations], dtype=np.float64) / sum(c.n for c in calibrations)
    if first.method == PLATT:
        a, b = np.sum([w * np.array(c.params[0]) for w, c in zip(weights, calibrations)], axis=0)
        params = ((float(a), float(b)),)
    else:
        x = np.unique(np.concatenate([c.params[0] for c in calibrations]))
        y = np.sum([w * c.calibrated(x) for w, c in zip(weights, calibrations)], axis=0)
        params = (tuple(float(v) for v in x), tuple(float(v) for v in y))
    scores = tuple(sorted(s for c in calibrations for s in c.scores))
    return ClassCalibration(task=first.task, method=first.method, params=params, scores=scores)

