"""Evaluation metrics with upstream's semantics (docs/upstream-compatibility.md#metrics).

Per task, only rows with a label (not NaN) are scored. A task with no labels is NaN; a classification task whose
labels (or predictions) are all 0 or all 1 is NaN. Threshold metrics binarise probabilities with ``p > 0.5``.
Averages over tasks are nan-means.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import numpy as np

from kermt.registry import LOWER_IS_BETTER, MetricDirection

MetricFn = Callable[[np.ndarray, np.ndarray], float]
THRESHOLD = 0.5


def _sklearn_metrics():
    """scikit-learn's metrics module, imported on first use. Importing it (with scipy.stats and pandas under it)
    costs about a CPU-second, and every Ray process that imports kermt paid it at start, though prediction actors,
    Serve replicas and featurising tasks never score anything (bench/import_cost.py)."""
    from sklearn import metrics

    return metrics


def _hard(preds: np.ndarray) -> np.ndarray:
    return (preds > THRESHOLD).astype(int)


def prc_auc(targets: np.ndarray, preds: np.ndarray) -> float:
    precision, recall, _ = _sklearn_metrics().precision_recall_curve(targets, preds)
    return float(_sklearn_metrics().auc(recall, precision))


def rmse(targets: np.ndarray, preds: np.ndarray) -> float:
    return math.sqrt(_sklearn_metrics().mean_squared_error(targets, preds))


def accuracy(targets: np.ndarray, preds: np.ndarray) -> float:
    return float(_sklearn_metrics().accuracy_score(targets, _hard(preds)))


def recall(targets: np.ndarray, preds: np.ndarray) -> float:
    return float(_sklearn_metrics().recall_score(targets, _hard(preds)))


def specificity(targets: np.ndarray, preds: np.ndarray) -> float:
    tn, fp, _, _ = _sklearn_metrics().confusion_matrix(targets, _hard(preds), labels=[0, 1]).ravel()
    return tn / float(tn + fp)


def matthews_corrcoef(targets: np.ndarray, preds: np.ndarray) -> float:
    """Matthews correlation of the thresholded predictions (upstream lists it but raises)."""
    return float(_sklearn_metrics().matthews_corrcoef(targets, _hard(preds)))


def spearman(targets: np.ndarray, preds: np.ndarray) -> float:
    from scipy.stats import spearmanr  # imported on first use: _sklearn_metrics says why

    return float(spearmanr(targets, preds).statistic)


# One function per name of kermt.registry.METRIC_TABLE (which also says the dataset type and direction).
METRICS: dict[str, MetricFn] = {
    "auc": lambda t, p: float(_sklearn_metrics().roc_auc_score(t, p)),
    "prc-auc": prc_auc,
    "rmse": rmse,
    "mae": lambda t, p: float(_sklearn_metrics().mean_absolute_error(t, p)),
    "r2": lambda t, p: float(_sklearn_metrics().r2_score(t, p)),
    "accuracy": accuracy,
    "recall": recall,
    "sensitivity": recall,
    "specificity": specificity,
    "matthews_corrcoef": matthews_corrcoef,
    "spearmanr": spearman,
}


def get_metric(name: str) -> MetricFn:
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose one of {sorted(METRICS)}")
    return METRICS[name]


def metric_direction(name: str) -> MetricDirection:
    """Whether lower ("min") or higher ("max") values of the metric are better."""
    get_metric(name)
    return "min" if name in LOWER_IS_BETTER else "max"


def _degenerate_classification(targets: np.ndarray, preds: np.ndarray) -> bool:
    def constant_binary(values: np.ndarray) -> bool:
        return bool(np.all(values == 0) or np.all(values == 1))

    return constant_binary(targets) or constant_binary(preds)


def _unscorable(y: np.ndarray, p: np.ndarray, dataset_type: str) -> str | None:
    """Why a task's labelled rows cannot be scored (upstream skips these tasks too), or None."""
    if y.size == 0:
        return "no labels"
    if dataset_type == "classification" and _degenerate_classification(y, p):
        return "one class only" if _degenerate_classification(y, y) else "predictions all 0 or all 1"
    return None


def task_scores(preds: np.ndarray, targets: np.ndarray, metric: str, dataset_type: str) -> list[float]:
    """One score per task. preds, targets: [N, T]; NaN in ``targets`` marks a missing label."""
    fn = get_metric(metric)
    preds, targets = np.asarray(preds, dtype=float), np.asarray(targets, dtype=float)
    scores = []
    for task in range(targets.shape[1]):
        labelled = ~np.isnan(targets[:, task])
        y, p = targets[labelled, task], preds[labelled, task]
        if _unscorable(y, p, dataset_type):
            scores.append(float("nan"))
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. r2/spearman of one sample: NaN, as upstream
            scores.append(fn(y, p))
    return scores


def unscored_note(task_names: list[str], preds: np.ndarray, targets: np.ndarray, scores: list[float],
                  dataset_type: str) -> str | None:
    """When some tasks have no score (so the task mean leaves them out), which ones and why, e.g.
    ``"2 of 3 tasks scored; not scored: rare (one class only), sparse (no labels)"``; None when all are scored."""
    preds, targets = np.asarray(preds, dtype=float), np.asarray(targets, dtype=float)
    missing = []
    for task, (name, value) in enumerate(zip(task_names, scores)):
        if np.isnan(value):
            labelled = ~np.isnan(targets[:, task])
            why = _unscorable(targets[labelled, task], preds[labelled, task], dataset_type)
            missing.append(f"{name} ({why or 'the metric is undefined for these labels'})")
    if not missing:
        return None
    return f"{len(scores) - len(missing)} of {len(scores)} tasks scored; not scored: {', '.join(missing)}"


def nanmean(scores: list[float]) -> float:
    """Mean over tasks ignoring NaN; NaN when every task is NaN."""
    values = np.asarray(scores, dtype=float)
    return float(np.nanmean(values)) if np.any(~np.isnan(values)) else float("nan")
