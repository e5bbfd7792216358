"""The calibration of the ensemble a `kermt predict --checkpoint_dir` reads: its folds' ``calibration.json``.

A finetune run's ensemble is every member of every fold; each fold was calibrated on its own validation split
with its own members. With one fold (the default) that calibration is exactly the ensemble's. With several folds
the folds' scores are pooled (each validation molecule scored by its own fold's ensemble): the predicting ensemble
has more members than any fold's, so the pooled calibration is an approximation (CV+ is not implemented).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kermt.errors import UserError
from kermt.run_layout import CALIBRATION_FILE
from kermt.uncertainty.calibration_file import load_calibrations
from kermt.uncertainty.conformal import Calibration

HOW_TO_CALIBRATE = ("train it again with this kermt: `kermt finetune` calibrates each fold's ensemble on its "
                    "validation split (at least 20 labelled molecules: see --split_sizes)")


def calibration_files(checkpoint_dir: str | Path) -> list[Path] | None:
    """The calibration file of a fold directory, or of every fold of a run; None if any fold has none."""
    root = Path(checkpoint_dir)
    if (root / CALIBRATION_FILE).is_file():
        return [root / CALIBRATION_FILE]
    folds = sorted((p for p in root.glob("fold_*") if p.is_dir() and re.fullmatch(r"fold_\d+", p.name)),
                   key=lambda p: int(p.name.split("_")[1]))
    files = [fold / CALIBRATION_FILE for fold in folds]
    return files if files and all(f.is_file() for f in files) else None


def run_calibration(checkpoint_dir: str | Path, tasks: tuple[str, ...]) -> dict[str, Calibration] | None:
    """Each task's calibration (folds pooled), or None when the model has none; a file without one of ``tasks``
    is an error naming it."""
    files = calibration_files(checkpoint_dir)
    if files is None:
        return None
    per_file = [load_calibrations(str(f)) for f in files]
    for path, calibrations in zip(files, per_file):
        missing = [t for t in tasks if t not in calibrations]
        if missing:
            raise UserError(f"calibration file {path} has no entry for task(s) {missing} of the model (it has "
                            f"{sorted(calibrations)}); {HOW_TO_CALIBRATE}")
    return {task: pooled([c[task] for c in per_file]) for task in tasks}


def pooled(calibrations: list[Calibration]) -> Calibration:
    """One calibration from several folds' (same task and method): scores merged, floors and z-scales averaged
    (z-scales as a root mean square weighted by n, the fit on the pooled scores)."""
    first = calibrations[0]
    if len(calibrations) == 1:
        return first
    if len({c.method for c in calibrations}) > 1:
        raise UserError(f"task {first.task!r}: the folds were calibrated with different methods "
                        f"{sorted({c.method for c in calibrations})}; predict with one fold's directory")
    pairs = sorted((s, sigma) for c in calibrations for s, sigma in zip(c.scores, c.sigmas or [None] * c.n))
    scores = tuple(s for s, _ in pairs)
    sigmas = tuple(sigma for _, sigma in pairs) if first.sigmas is not None else None
    n = np.array([c.n for c in calibrations], dtype=np.float64)
    zs = [c.z_scale for c in calibrations]
    z_scale = None if None in zs else float(np.sqrt(np.sum(n * np.square(zs)) / n.sum()))
    floors = [c.sigma_floor for c in calibrations]
    floor = None if None in floors else float(np.mean(floors))
    return Calibration(task=first.task, method=first.method, scores=scores, z_scale=z_scale, sigma_floor=floor,
                       sigmas=sigmas)
