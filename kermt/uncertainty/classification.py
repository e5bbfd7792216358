"""Calibrated probabilities and conformal prediction sets for binary classification tasks, one task at a time.

A classification calibration is fitted on labelled molecules the model never trained on (a finetune's validation
split, or a user's own assay file), from the ensemble's mean probability ``p`` of class 1:

* ``platt`` (default): logistic regression of the label on ``logit(p)``: ``p' = sigmoid(a·logit(p) + b)``. Two
  numbers; fixes an ensemble that is over- or under-confident (``a``) or biased (``b``); keeps the ranking (AUC).
* ``isotonic``: the non-decreasing step function of ``p`` that best fits the labels (scikit-learn's
  IsotonicRegression), stored as its thresholds ``x``/``y`` and applied by linear interpolation between them
  (clipped outside). More flexible, needs more molecules (a few hundred) not to overfit.

Prediction sets (``<task>_set``): nonconformity ``1 - p(true class)`` on the calibration molecules, of the model's
own probabilities (not the recalibrated ones, so the guarantee below does not depend on the calibrator's fit); the
set at level ``1 - alpha`` is every class whose ``1 - p(class) <= q``, ``q`` the finite-sample conformal quantile
(:func:`kermt.uncertainty.conformal.conformal_quantile`). Written ``"0"``, ``"1"``, ``"0,1"`` (not sure) or ``""``
(empty: neither class is plausible at this level). Guarantee: on molecules exchangeable with the calibration set,
P(true class in set) >= 1 - alpha, marginally (averaged over molecules, not per molecule or per class).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit, logit

from kermt.errors import UserError
from kermt.registry import CLASS_CALIBRATION_METHODS, DEFAULT_CLASS_CALIBRATION_METHOD
from kermt.uncertainty.conformal import DEFAULT_SPLIT_FLAG, conformal_quantile, labelled_rows
from kermt.uncertainty.metrics import probability_report, set_report

CLASSIFICATION_METHODS = CLASS_CALIBRATION_METHODS  # the names, once, in kermt.registry
PLATT, ISOTONIC = CLASSIFICATION_METHODS
DEFAULT_CLASSIFICATION_METHOD = DEFAULT_CLASS_CALIBRATION_METHOD
PROBABILITY_CLIP = 1e-6  # logit(0) is -inf: probabilities are clipped to [1e-6, 1 - 1e-6] before the Platt fit


@dataclass(frozen=True)
class ClassCalibration:
    """One binary task's calibration. ``params``: Platt ``(a, b)``; isotonic: the thresholds ``x`` then ``y``
    (``x`` sorted, ``y`` non-decreasing in [0, 1]). ``scores``: the sorted set nonconformity scores, ``n`` of them."""

    task: str
    method: str
    params: tuple[tuple[float, ...], ...]
    scores: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.scores)

    def calibrated(self, p: np.ndarray) -> np.ndarray:
        """The recalibrated probability of class 1; NaN where ``p`` is NaN (invalid molecules)."""
        p = np.asarray(p, dtype=np.float64)
        if self.method == PLATT:
            (a, b), = self.params
            return expit(a * logit(np.clip(p, PROBABILITY_CLIP, 1 - PROBABILITY_CLIP)) + b)
        x, y = self.params
        return np.where(np.isnan(p), np.nan, np.interp(p, x, y))

    def quantile(self, level: float) -> float:
        return conformal_quantile(self.scores, level, self.task)

    def sets(self, p: np.ndarray, level: float) -> list[str | None]:
        """Each molecule's prediction set at ``level`` from the model's own probability ``p`` of class 1; None
        where ``p`` is NaN."""
        q = self.quantile(level)
        return [None if np.isnan(v) else ",".join(c for c, p_c in (("0", 1 - v), ("1", v)) if 1 - p_c <= q)
                for v in np.asarray(p, dtype=np.float64)]


def fit_class_calibration(task: str, p: np.ndarray, y: np.ndarray, method: str = DEFAULT_CLASSIFICATION_METHOD,
                          source: str = "the calibration set",
                          split_flag: str | None = DEFAULT_SPLIT_FLAG) -> ClassCalibration:
    """Fit one task's calibration on ``p`` (the model's probability of class 1) and ``y`` (labels 0/1, NaN =
    unlabelled: skipped). ``source`` names the file/split in error messages, ``split_flag`` the flag that sizes
    it (``conformal.labelled_rows``)."""
    if method not in CLASSIFICATION_METHODS:
        raise UserError(f"classification calibration method {method!r} is not one of "
                        f"{', '.join(CLASSIFICATION_METHODS)}")
    p, y = _labelled(task, p, y, source, split_flag)
    # scikit-learn on first use, as kermt.metrics imports it: predicting with a fitted calibration never needs it
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    if method == PLATT:
        fit = LogisticRegression(C=1e6).fit(logit(np.clip(p, PROBABILITY_CLIP, 1 - PROBABILITY_CLIP))[:, None], y)
        params = ((float(fit.coef_[0, 0]), float(fit.intercept_[0])),)
    else:
        fit = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(p, y)
        params = (tuple(float(v) for v in fit.X_thresholds_), tuple(float(v) for v in fit.y_thresholds_))
    scores = np.sort(1.0 - np.where(y == 1, p, 1 - p))
    return ClassCalibration(task=task, method=method, params=params, scores=tuple(float(s) for s in scores))


def _labelled(task: str, p: np.ndarray, y: np.ndarray, source: str,
              split_flag: str | None) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    labelled = labelled_rows(y, task, source, split_flag)
    p, y = p[labelled], y[labelled]
    if not set(np.unique(y)) <= {0.0, 1.0}:
        raise UserError(f"{source}: column {task!r} has labels other than 0 and 1 (e.g. {y[(y != 0) & (y != 1)][0]})"
                        "; a classification calibration needs binary labels")
    if len(np.unique(y)) < 2:
        raise UserError(f"{source}: column {task!r}: every labelled molecule is class {int(y[0])}; a calibration "
                        "needs both classes among its labelled molecules")
    if not (np.isfinite(p) & (p >= 0) & (p <= 1)).all():
        raise UserError(f"{source}: column {task!r}: a labelled molecule has no probability in [0, 1]")
    return p, y



def fit_class_calibrations(tasks: tuple[str, ...] | list[str], member_probs: np.ndarray, labels: np.ndarray,
                           method: str = DEFAULT_CLASSIFICATION_METHOD,
                           source: str = "the validation split",
                           split_flag: str | None = DEFAULT_SPLIT_FLAG) -> dict[str, ClassCalibration]:
    """Every task's calibration of an ensemble from its validation predictions: ``member_probs`` [K, N, T] (each
    member's probabilities; [N, T] for one model or an already averaged ensemble), ``labels`` [N, T] (0/1, NaN =
    unlabelled). All or nothing, as the regression calibration is: a task that cannot be calibrated (fewer than 20
    labelled molecules, one class) raises its one-line UserError, which a finetune hook reports and records."""
    probs = np.asarray(member_probs, dtype=np.float64)
    mean = probs.mean(axis=0) if probs.ndim == 3 else probs
    labels = np.asarray(labels, dtype=np.float64)
    if mean.shape != labels.shape or mean.shape[1] != len(tasks):
        raise ValueError(f"predictions {mean.shape} and labels {labels.shape} must both be (molecules, "
                         f"{len(tasks)} tasks)")
    return {task: fit_class_calibration(task, mean[:, t], labels[:, t], method, source, split_flag)
            for t, task in enumerate(tasks)}


def class_calibration_record(calibrations: dict[str, ClassCalibration], mean_probs: np.ndarray,
                             labels: np.ndarray, level: float = 0.9) -> dict[str, dict[str, float]]:
    """Per task, what a run.json records: n, ECE and Brier before/after on the calibration molecules themselves
    (in-sample: the "after" is optimistic, most for isotonic) and the mean set size at ``level`` (if the split is
    large enough for it)."""
    record = {}
    for t, (task, calibration) in enumerate(calibrations.items()):
        p, y = np.asarray(mean_probs)[:, t], np.asarray(labels, dtype=np.float64)[:, t]
        entry = {"n": calibration.n, **probability_report(y, p),
                 **{f"calibrated_{k}": v for k, v in probability_report(y, calibration.calibrated(p)).items()}}
        if calibration.n >= math.ceil(level / (1 - level) - 1e-9):
            entry[f"mean_set_size_{level}"] = set_report(y, calibration.sets(p, level))["mean_set_size"]
        record[task] = entry
    return record
