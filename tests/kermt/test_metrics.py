"""Metrics vs sklearn/scipy computed here, with upstream's per-task filtering and NaN rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn import metrics as skm

from kermt.metrics import METRICS, metric_direction, nanmean, task_scores, unscored_note

NAN = float("nan")
RNG = np.random.default_rng(0)
Y_CLS = np.array([0, 1, 1, 0, 1, 0, 0, 1, 1, 0], dtype=float)
P_CLS = np.array([0.1, 0.7, 0.4, 0.2, 0.9, 0.6, 0.3, 0.8, 0.55, 0.45])
Y_REG = RNG.normal(size=10)
P_REG = Y_REG + RNG.normal(scale=0.5, size=10)
HARD = (P_CLS > 0.5).astype(int)

EXPECTED = {
    "auc": lambda: skm.roc_auc_score(Y_CLS, P_CLS),
    "prc-auc": lambda: skm.auc(*skm.precision_recall_curve(Y_CLS, P_CLS)[1::-1]),
    "accuracy": lambda: skm.accuracy_score(Y_CLS, HARD),
    "recall": lambda: skm.recall_score(Y_CLS, HARD),
    "sensitivity": lambda: skm.recall_score(Y_CLS, HARD),
    "specificity": lambda: np.sum((HARD == 0) & (Y_CLS == 0)) / np.sum(Y_CLS == 0),
    "matthews_corrcoef": lambda: skm.matthews_corrcoef(Y_CLS, HARD),
    "rmse": lambda: math.sqrt(skm.mean_squared_error(Y_REG, P_REG)),
    "mae": lambda: skm.mean_absolute_error(Y_REG, P_REG),
    "r2": lambda: skm.r2_score(Y_REG, P_REG),
    "spearmanr": lambda: spearmanr(Y_REG, P_REG).statistic,
}
CLASSIFICATION = {"auc", "prc-auc", "accuracy", "recall", "sensitivity", "specificity", "matthews_corrcoef"}


def test_every_metric_is_covered():
    assert set(METRICS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_metric_values_skip_missing_labels(name):
    classification = name in CLASSIFICATION
    y, p = (Y_CLS, P_CLS) if classification else (Y_REG, P_REG)
    # second task: the same data with two extra unlabelled rows holding garbage predictions
    targets = np.stack([np.append(y, [y[0], y[1]]), np.append(y, [NAN, NAN])], axis=1)
    preds = np.stack([np.append(p, [p[0], p[1]]), np.append(p, [0.99, -5.0])], axis=1)
    scores = task_scores(preds[:-2], targets[:-2], name, "classification" if classification else "regression")
    assert scores[0] == pytest.approx(EXPECTED[name](), rel=1e-12)
    scores = task_scores(preds, targets, name, "classification" if classification else "regression")
    assert scores[1] == pytest.approx(EXPECTED[name](), rel=1e-12)


def test_nan_rules():
    targets = np.array([[1.0, NAN, 0.0], [1.0, NAN, 1.0], [1.0, NAN, 0.0]])
    preds = np.array([[0.2, 0.3, 0.0], [0.9, 0.1, 0.0], [0.4, 0.6, 0.0]])
    scores = task_scores(preds, targets, "auc", "classification")
    assert all(math.isnan(s) for s in scores)  # single class / no labels / all-zero predictions
    assert math.isnan(nanmean(scores))
    assert nanmean([1.0, NAN, 3.0]) == 2.0
    assert unscored_note(["a", "b", "c"], preds, targets, scores, "classification") == (
        "0 of 3 tasks scored; not scored: a (one class only), b (no labels), c (predictions all 0 or all 1)")


def test_the_note_names_only_the_tasks_left_out_of_the_mean():
    targets = np.stack([Y_REG, Y_REG, np.full(10, NAN)], axis=1)
    targets[1:, 1] = NAN  # one label: r2 is undefined
    preds = np.stack([P_REG, P_REG, P_REG], axis=1)
    scores = task_scores(preds, targets, "r2", "regression")
    assert math.isnan(scores[1]) and math.isnan(scores[2]) and not math.isnan(scores[0])
    assert unscored_note(["logS", "pKa", "clearance"], preds, targets, scores, "regression") == (
        "1 of 3 tasks scored; not scored: pKa (the metric is undefined for these labels), clearance (no labels)")
    assert unscored_note(["logS"], preds[:, :1], targets[:, :1], scores[:1], "regression") is None


def test_directions():
    assert metric_direction("rmse") == "min" and metric_direction("mae") == "min"
    assert all(metric_direction(m) == "max" for m in METRICS if m not in {"rmse", "mae"})
    with pytest.raises(ValueError, match="unknown metric"):
        metric_direction("rsme")
