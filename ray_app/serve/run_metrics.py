"""``GET /models``' ``training``: what the finetune run's ``run.json`` recorded about how good the model is.

Read once on the driver, from the run directory being served (a single checkpoint, or a run that never finished,
has no run.json: ``training`` is null; a key an older run did not record is null). Per-task test scores: run.json
records each member's test score per task (``folds.fold_k.member_test_scores``), not the ensemble's, so
``task_test_scores`` is their mean over every member of every fold; ``overall_test_score`` is the ensemble's (the
run's final ``overall_<split>_test_<metric>`` line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from kermt.checkpoint import is_native_checkpoint
from kermt.data.splits import split_description
from kermt.run_layout import IN_TRAINING_SPLIT_KEY, RUN_RECORD_FILE
from kermt.uncertainty.calibration_file import read_json_file
from ray_app.serve.schemas import TrainingMetrics

VALIDATION_MOLECULES = "validation molecules"  # what a run calibrated without --calibration_path was fitted on


def _setting(record: dict, name: str) -> Any:
    entry = (record.get("settings") or {}).get(name)
    return entry.get("value") if isinstance(entry, dict) else None


def _task_test_scores(folds: dict) -> Optional[dict[str, float]]:
    """Each task's test score averaged over every member of every fold (NaN where a member had no labels)."""
    per_task: dict[str, list[float]] = {}
    for fold in folds.values():
        for member in (fold or {}).get("member_test_scores") or ():
            for task, value in member.items():
                per_task.setdefault(task, []).append(np.nan if value is None else float(value))
    if not per_task:
        return None
    return {task: float(np.nanmean(values)) if not np.isnan(values).all() else None
            for task, values in per_task.items()}


def _calibration_source(folds: list[dict]) -> str:
    """What the folds were calibrated on: a ``--calibration_path`` file (run.json records, only then, how many of
    its molecules were also in a fold's training split) as run.json names it, else their validation splits."""
    files = [str(fold["source"]) for fold in folds if IN_TRAINING_SPLIT_KEY in fold and fold.get("source")]
    return files[0] if files else VALIDATION_MOLECULES


def _calibration(calibration: dict) -> tuple[Optional[str], Optional[dict[str, int]], Optional[str]]:
    """The folds' method (``"mixed"`` when folds differ), each task's calibration molecules over the folds, and what
    they were."""
    folds = [fold for fold in calibration.values() if isinstance(fold, dict) and fold.get("method")]
    if not folds:
        return None, None, None
    methods = {fold["method"] for fold in folds}
    sizes: dict[str, int] = {}
    for fold in folds:
        for task, entry in (fold.get("tasks") or {}).items():
            sizes[task] = sizes.get(task, 0) + int((entry or {}).get("n") or 0)
    return (methods.pop() if len(methods) == 1 else "mixed"), sizes or None, _calibration_source(folds)


def _split(record: dict, split_type: Optional[str]) -> Optional[str]:
    """run.json's split in words (a run recorded before it: the same words from its settings)."""
    if record.get("split") or not split_type:
        return record.get("split")
    return split_description(split_type, _setting(record, "separate_val_path"), _setting(record, "separate_test_path"))


def training_metrics(source: str | Path) -> Optional[TrainingMetrics]:
    """The served run's recorded scores, or None when ``source`` is not a run directory holding run.json."""
    path = Path(source)
    if not path.is_dir() or is_native_checkpoint(path) or not (path / RUN_RECORD_FILE).is_file():
        return None
    record = read_json_file(str(path / RUN_RECORD_FILE), "finetune run record")
    if not isinstance(record, dict):
        return None
    summary = record.get("summary") or {}
    metric, split_type = summary.get("metric"), _setting(record, "split_type")
    method, sizes, on = _calibration(record.get("calibration") or {})
    return TrainingMetrics(
        run_id=summary.get("run_id"), metric=metric, split_type=split_type, split=_split(record, split_type),
        overall_test_score=summary.get(f"overall_{split_type}_test_{metric}"), overall_test_std=summary.get("std"),
        fold_test_scores=summary.get("fold_scores"), task_test_scores=_task_test_scores(record.get("folds") or {}),
        calibration_method=method, calibration_size=sizes, calibration_source=on)


__all__ = ["training_metrics"]
