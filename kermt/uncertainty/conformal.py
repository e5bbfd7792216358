"""Split conformal regression: one task's calibration and the intervals it gives.

A calibration is fitted on labelled molecules the model never trained on (a finetune's validation split, or a
user's own assay file). Each molecule gets a nonconformity score; an interval at level ``1 - alpha`` is the
prediction widened by the finite-sample conformal quantile of those scores, the ``ceil((n + 1)(1 - alpha))``-th
smallest of ``n``. Only the sorted scores are kept, so one calibration serves any ``--interval`` level later.

Methods (the name is stored with the calibration):

* ``normalised`` (default): score ``|y - mu| / sigma``, interval ``mu ± q·sigma``: narrow where the ensemble agrees,
  wide where it does not. ``sigma`` is floored at :data:`SIGMA_FLOOR_FRACTION` of the calibration set's median
  spread, the same floor at calibration and at prediction, so a molecule whose members happen to agree exactly still
  gets an interval (and the score of such a molecule stays finite).
* ``plain``: score ``|y - mu|``, one width for every molecule (the comparison, and the only choice with one model
  per fold: its spread is 0).
* ``mondrian``: normalised scores, with one quantile per sigma bin (the calibration set's sigma terciles, fewer
  bins when it is small: each holds at least :data:`MONDRIAN_MIN_BIN_ROWS`). Group-conditional conformal: the
  coverage holds within each bin, so the molecules the ensemble is least sure of are not under-covered to pay for
  the confident ones. Keeps each calibration molecule's sigma beside its score.
* ``mondrian_domain``: normalised scores, with one quantile per bin of the applicability-domain distance
  (``domain_distance``, :mod:`kermt.uncertainty.domain`: the calibration set's distance terciles, fewer bins when it
  is small, as ``mondrian``'s). The coverage holds within each distance bin, so molecules far from the training set
  get the quantile of the far calibration molecules (wider where those were predicted worse) instead of a share of
  one quantile that the near ones dominate. A molecule farther than every calibration molecule takes the farthest
  bin's quantile: no extrapolation beyond what was calibrated. Keeps each score's distance beside it; predicting
  needs the same distance for each new molecule (the model's own domain index).
* ``zscaling``: ``sigma`` scaled by the factor that minimises the Gaussian NLL on the calibration set
  (``s² = mean(r² / sigma²)``), interval ``mu ± z·s·sigma``; no coverage guarantee, kept for NLL and comparison.

NaN/inf or negative spreads are an error, never floored: they mean something upstream went wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kermt.errors import UserError
from kermt.registry import CALIBRATION_METHODS, DEFAULT_CALIBRATION_METHOD

METHODS = CALIBRATION_METHODS
NORMALISED, PLAIN, MONDRIAN, ZSCALING, MONDRIAN_DOMAIN = METHODS
DEFAULT_METHOD = DEFAULT_CALIBRATION_METHOD
MIN_CALIBRATION_ROWS = 20  # below this the conformal quantile of a 90 % interval is the largest score or undefined
SIGMA_FLOOR_FRACTION = 0.01  # of the median calibration spread: a floor that only exact ties ever reach
MONDRIAN_BINS = 3
MONDRIAN_MIN_BIN_ROWS = 30  # a 90 % quantile of fewer scores is mostly the largest one


@dataclass(frozen=True)
class Calibration:
    """One task's calibration. ``scores``: the sorted nonconformity scores (the method's), ``n`` of them;
    ``z_scale``: the NLL-fitted factor for sigma (None without a spread); ``sigma_floor``: the smallest sigma used
    (None for ``plain``); ``sigmas``: ``mondrian`` only, each score's (floored) sigma, aligned with ``scores``;
    ``distances``: ``mondrian_domain`` only, each score's applicability-domain distance, aligned with ``scores``."""

    task: str
    method: str
    scores: tuple[float, ...]
    z_scale: float | None
    sigma_floor: float | None
    sigmas: tuple[float, ...] | None = None
    distances: tuple[float, ...] | None = None

    @property
    def n(self) -> int:
        return len(self.scores)

    def quantile(self, level: float) -> float:
        """The finite-sample conformal quantile for a ``level`` interval: the ceil((n+1)·level)-th smallest score."""
        return conformal_quantile(self.scores, level, self.task)

    @property
    def needs_distance(self) -> bool:
        """Whether intervals from it need each molecule's applicability-domain distance."""
        return self.method == MONDRIAN_DOMAIN

    def _bin_by(self) -> tuple[np.ndarray, str]:
        """The calibration molecules' values its bins split (sigmas, or distances) and what they are called."""
        if self.method == MONDRIAN_DOMAIN:
            return np.asarray(self.distances), "distance"
        return np.asarray(self.sigmas), "sigma"

    def bin_edges(self) -> np.ndarray:
        """``mondrian`` / ``mondrian_domain``: the sigmas / distances that separate its bins (quantiles of the
        calibration molecules' values; empty: one bin)."""
        bins = max(1, min(MONDRIAN_BINS, self.n // MONDRIAN_MIN_BIN_ROWS))
        return np.quantile(self._bin_by()[0], np.arange(1, bins) / bins)

    def bin_quantiles(self, level: float) -> np.ndarray:
        """One conformal quantile per bin, from the scores of the calibration molecules in it."""
        (values, what), scores, edges = self._bin_by(), np.asarray(self.scores), self.bin_edges()
        where = np.searchsorted(edges, values, side="right")
        return np.array([conformal_quantile(np.sort(scores[where == b]), level, f"{self.task} ({what} bin {b + 1})")
                         for b in range(len(edges) + 1)])

    def calibrated_sigma(self, sigma: np.ndarray) -> np.ndarray:
        """sigma scaled for NLL (z-scaling); needs a spread."""
        if self.z_scale is None:
            raise UserError(f"task {self.task!r}: its calibration has no spread to scale (one model per fold)")
        return self.z_scale * np.asarray(sigma, dtype=np.float64)


def conformal_quantile(sorted_scores, level: float, task: str) -> float:
    """The ceil((n+1)·level)-th smallest of ``n`` sorted scores; a UserError when ``n`` is too small for ``level``."""
    check_level(level)
    n = len(sorted_scores)
    rank = math.ceil((n + 1) * level - 1e-9)  # 1e-9: (n+1)·level that is an integer must not round up
    if rank > n:
        needed = math.ceil(level / (1 - level) - 1e-9)
        raise UserError(f"--interval {level}: task {task!r} was calibrated on {n} molecules, and a {level} interval "
                        f"needs at least {needed}; ask for a lower level or recalibrate on more labelled molecules")
    return float(sorted_scores[rank - 1])


def check_level(level: float) -> None:
    if not (isinstance(level, (int, float)) and 0.0 < float(level) < 1.0):
        raise UserError(f"--interval {level}: an interval level must lie strictly between 0 and 1 (e.g. 0.9)")


DEFAULT_SPLIT_FLAG = "--split_sizes"  # kermt finetune's; callers with another flag pass theirs


def fit_calibration(task: str, mu: np.ndarray, y: np.ndarray, sigma: np.ndarray | None,
                    method: str = DEFAULT_METHOD, source: str = "the calibration set",
                    distance: np.ndarray | None = None, split_flag: str | None = DEFAULT_SPLIT_FLAG) -> Calibration:
    """Fit one task's calibration on ``mu`` (predictions), ``y`` (labels, NaN = unlabelled: skipped) and ``sigma``
    (the ensemble's spread; None for a single model). ``source`` names the file/split in error messages;
    ``distance``: each molecule's applicability-domain distance (``mondrian_domain`` needs it); ``split_flag``: the
    caller's flag that sizes the split ``y`` comes from (:func:`labelled_rows`)."""
    if method not in METHODS:
        raise UserError(f"calibration method {method!r} is not one of {', '.join(METHODS)}")
    mu, y = np.asarray(mu, dtype=np.float64), np.asarray(y, dtype=np.float64)
    labelled = labelled_rows(y, task, source, split_flag)
    if not np.isfinite(mu[labelled]).all():
        raise UserError(f"{source}: column {task!r}: a labelled molecule has no finite prediction")
    residual = np.abs(y[labelled] - mu[labelled])
    spread = None if sigma is None else _checked_sigma(np.asarray(sigma, dtype=np.float64)[labelled], task, source)
    if method != PLAIN and (spread is None or not (spread > 0).any()):
        raise UserError(f"{source}: column {task!r}: method {method!r} needs an ensemble's spread, and every sigma "
                        "is 0 (one model per fold); use method 'plain' or train --ensemble_size 2 or more")
    floor = None if spread is None or not (spread > 0).any() else \
        SIGMA_FLOOR_FRACTION * float(np.median(spread[spread > 0]))
    z_scale = None if floor is None else float(np.sqrt(np.mean((residual / np.maximum(spread, floor)) ** 2)))
    scores = residual if method == PLAIN else residual / np.maximum(spread, floor)
    order = np.argsort(scores, kind="stable")
    sigmas = tuple(float(s) for s in np.maximum(spread, floor)[order]) if method == MONDRIAN else None
    distances = None
    if method == MONDRIAN_DOMAIN:
        if distance is None:
            raise UserError(f"{source}: column {task!r}: method {method!r} needs each molecule's applicability-domain "
                            "distance, and the model has no domain index")
        checked = _checked_distance(np.asarray(distance, dtype=np.float64)[labelled], task, source)
        distances = tuple(float(d) for d in checked[order])
    return Calibration(task=task, method=method, scores=tuple(float(s) for s in scores[order]), z_scale=z_scale,
                       sigma_floor=None if method == PLAIN else floor, sigmas=sigmas, distances=distances)


def labelled_rows(y: np.ndarray, task: str, source: str, split_flag: str | None = DEFAULT_SPLIT_FLAG) -> np.ndarray:
    """The mask of ``y``'s labelled rows (not NaN); fewer than :data:`MIN_CALIBRATION_ROWS` is a UserError whose
    advice names ``split_flag``, the flag that sizes the split ``y`` comes from in the calling command (finetune's
    --split_sizes, explore's --validation_share; None: ``y`` is a file of its own, no split to enlarge)."""
    labelled = ~np.isnan(y)
    n = int(labelled.sum())
    if n < MIN_CALIBRATION_ROWS:
        larger = f"a larger validation split ({split_flag}) or " if split_flag else ""
        raise UserError(f"{source}: column {task!r} has {n} labelled molecule(s); a calibration needs at least "
                        f"{MIN_CALIBRATION_ROWS}: use {larger}more labelled molecules")
    return labelled


def intervals(calibration: Calibration, mu: np.ndarray, sigma: np.ndarray | None,
              level: float, distance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) at ``level`` for predictions ``mu`` with spreads ``sigma`` (and applicability-domain
    distances ``distance``, which ``mondrian_domain`` needs); NaN where ``mu`` is NaN (invalid molecules)."""
    mu = np.asarray(mu, dtype=np.float64)
    if calibration.method == PLAIN:
        half = np.full_like(mu, calibration.quantile(level))
    else:
        if sigma is None:
            raise UserError(f"task {calibration.task!r}: its {calibration.method} calibration needs the ensemble's "
                            "spread")
        spread = np.asarray(sigma, dtype=np.float64)
        valid = ~np.isnan(mu)
        _checked_sigma(spread[valid], calibration.task, "the predictions")
        floored = np.maximum(spread, calibration.sigma_floor)
        if calibration.method == NORMALISED:
            half = calibration.quantile(level) * floored
        elif calibration.method in (MONDRIAN, MONDRIAN_DOMAIN):
            by = floored if calibration.method == MONDRIAN else _prediction_distance(calibration, distance, valid)
            bins = np.searchsorted(calibration.bin_edges(), np.nan_to_num(by), side="right")
            half = calibration.bin_quantiles(level)[bins] * floored
        else:
            check_level(level)
            from scipy.stats import norm  # on first use, as kermt.metrics imports scikit-learn (it says why)

            half = norm.ppf(0.5 + level / 2) * calibration.calibrated_sigma(spread)
    return mu - half, mu + half


def _prediction_distance(calibration: Calibration, distance: np.ndarray | None, valid: np.ndarray) -> np.ndarray:
    if distance is None:
        raise UserError(f"task {calibration.task!r}: its {calibration.method} calibration needs each molecule's "
                        "applicability-domain distance (the model's domain index)")
    distance = np.asarray(distance, dtype=np.float64)
    _checked_distance(distance[valid], calibration.task, "the predictions")
    return distance


def _checked_distance(distance: np.ndarray, task: str, source: str) -> np.ndarray:
    return _finite_non_negative(distance, task, source, "applicability-domain distance(s)", "a distance")


def _checked_sigma(sigma: np.ndarray, task: str, source: str) -> np.ndarray:
    return _finite_non_negative(sigma, task, source, "sigma value(s)", "an ensemble's spread")


def _finite_non_negative(values: np.ndarray, task: str, source: str, what: str, one: str) -> np.ndarray:
    """``values``, or a UserError naming ``source``, the task and the first NaN, infinite or negative one."""
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        raise UserError(f"{source}: column {task!r}: {int(bad.sum())} {what} are NaN, infinite or negative "
                        f"(first: {values[bad][0]}); {one} must be finite and >= 0")
    return values
