"""What a fold's report needs that the other files do not hold, recorded when the fold finishes: its split sizes and
labelled molecules per task (run.json ``folds``), each member's test score per task (run.json), and the members'
spread on each test molecule (``fold_k/test_spread.csv``, which turns the fold's calibration into test intervals;
with a ``mondrian_domain`` calibration, each test molecule's ``domain_distance`` after the tasks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kermt.inference.columns import DISTANCE_COLUMN, ensemble_spread
from kermt.metrics import task_scores
from ray_app.common import outputs
from ray_app.finetune.run_setup import RunSetup


def _labels(targets: np.ndarray, tasks: list[str], classification: bool) -> dict[str, dict[str, int]]:
    counts = {task: {"labelled": int(np.sum(~np.isnan(targets[:, t])))} for t, task in enumerate(tasks)}
    if classification:
        for t, task in enumerate(tasks):
            counts[task]["positives"] = int(np.nansum(targets[:, t] == 1))
    return counts


def fold_record(setup: RunSetup, fold: int, targets: dict[str, np.ndarray], test_smiles: Sequence[str],
                member_preds: list[np.ndarray], test_distances: np.ndarray | None = None) -> dict[str, Any]:
    """The fold's record for run.json; writes ``fold_k/test_spread.csv`` when the fold has 2 or more members.
    ``targets``: each split's ("train", "val", "test") targets, whose labelled counts it records (the test's raw:
    they are scored); ``test_distances``: the test molecules' domain distances, which a mondrian_domain
    calibration reads."""
    tasks, classification = list(setup.task_names), setup.dataset_type == "classification"
    test_raw = targets["test"]
    # an empty test split (kermt explore's surrogates have none) is (0, tasks), which reshape cannot infer
    labels = {name: _labels(np.asarray(t, dtype=np.float64).reshape(len(t), -1 if len(t) else len(tasks)), tasks,
                            classification) for name, t in targets.items()}
    record: dict[str, Any] = {
        "sizes": {name: len(t) for name, t in targets.items()},
        "labels": {task: {name: labels[name][task]["labelled"] for name in targets} for task in tasks},
    }
    if classification:
        record["positives"] = {task: {name: labels[name][task]["positives"] for name in targets} for task in tasks}
    scorable = len(test_raw) and tasks and not np.isnan(test_raw).all()
    record["member_test_scores"] = [
        dict(zip(tasks, task_scores(preds, test_raw, setup.metric, setup.dataset_type)))
        for preds in member_preds] if scorable else None
    if len(member_preds) > 1 and tasks:  # one member has no spread (its calibration is plain conformal)
        spread = ensemble_spread(member_preds)  # the population spread, as calibrate_fold's sigma
        names = tasks if test_distances is None else [*tasks, DISTANCE_COLUMN]
        if test_distances is not None:
            spread = np.column_stack([spread, test_distances])
        outputs.atomic_write_text(setup.layout.test_spread(fold),
                                  outputs.test_result_csv(test_smiles, names, spread, None))
    return record


__all__ = ["fold_record"]
