"""Metrics of a regression uncertainty on labelled molecules, one task at a time. Rows without a label (NaN) or
without a prediction are left out. Each takes numpy arrays of one task: ``y`` labels, ``mu`` predictions,
``sigma`` spreads (calibrated or not), ``lower``/``upper`` interval bounds.

``miscalibration_area`` and ``ence`` read ``sigma`` as a Gaussian standard deviation, as chemprop's evaluators do,
so a spread that is right up to a constant factor scores badly until it is z-scaled. Binary classification
(at the end): ECE, Brier score and the coverage and size of conformal prediction sets."""

from __future__ import annotations

import numpy as np

# scipy.stats and scikit-learn are imported where they are used, on first use: kermt.metrics._sklearn_metrics says why


def _kept(*arrays: np.ndarray) -> list[np.ndarray]:
    values = [np.asarray(a, dtype=np.float64) for a in arrays]
    keep = np.all([np.isfinite(v) for v in values], axis=0)
    return [v[keep] for v in values]


def coverage(y: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """The fraction of labelled molecules whose label lies inside [lower, upper]."""
    y, lower, upper = _kept(y, lower, upper)
    return float(np.mean((lower <= y) & (y <= upper))) if len(y) else float("nan")


def mean_width(lower: np.ndarray, upper: np.ndarray) -> float:
    lower, upper = _kept(lower, upper)
    return float(np.mean(upper - lower)) if len(lower) else float("nan")


def width_over_rmse(y: np.ndarray, mu: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """Mean width relative to the model's own error: how wide the intervals are for the accuracy the model has."""
    y, mu, lower, upper = _kept(y, mu, lower, upper)
    if not len(y):
        return float("nan")
    return float(np.mean(upper - lower) / np.sqrt(np.mean((y - mu) ** 2)))


def miscalibration_area(y: np.ndarray, mu: np.ndarray, sigma: np.ndarray, levels: int = 101) -> float:
    """Area between the observed fraction inside the central Gaussian interval and the expected fraction, over
    expected fractions 0..1 (0: perfectly calibrated; at most 0.5)."""
    y, mu, sigma = _kept(y, mu, sigma)
    if not len(y):
        return float("nan")
    expected = np.linspace(0.0, 1.0, levels)
    z = np.abs(y - mu) / np.maximum(sigma, np.finfo(np.float64).tiny)
    from scipy.stats import norm

    observed = np.array([np.mean(z <= norm.ppf(0.5 + p / 2)) for p in expected])
    return float(np.trapezoid(np.abs(observed - expected), expected))


def ence(y: np.ndarray, mu: np.ndarray, sigma: np.ndarray, bins: int = 10) -> float:
    """Expected normalised calibration error: molecules sorted by sigma into ``bins`` equal-count bins; the mean
    over bins of |RMV - RMSE| / RMV (RMV: root mean variance of the bin)."""
    y, mu, sigma = _kept(y, mu, sigma)
    if len(y) < bins:
        return float("nan")
    order = np.argsort(sigma, kind="stable")
    errors = []
    for part in np.array_split(order, bins):
        rmv = np.sqrt(np.mean(sigma[part] ** 2))
        rmse = np.sqrt(np.mean((y[part] - mu[part]) ** 2))
        errors.append(abs(rmv - rmse) / rmv if rmv > 0 else np.nan)
    return float(np.nanmean(errors)) if not np.isnan(errors).all() else float("nan")


def error_sigma_spearman(y: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> float:
    """Spearman rank correlation of |error| with sigma: does the model know where it is wrong?"""
    y, mu, sigma = _kept(y, mu, sigma)
    if len(y) < 2 or np.ptp(sigma) == 0:
        return float("nan")
    from scipy.stats import spearmanr

    return float(spearmanr(np.abs(y - mu), sigma).statistic)


def gaussian_nll(y: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> float:
    """Mean negative log-likelihood of the labels under N(mu, sigma²)."""
    y, mu, sigma = _kept(y, mu, sigma)
    if not len(y) or (sigma <= 0).any():
        return float("nan")
    from scipy.stats import norm

    return float(-np.mean(norm.logpdf(y, loc=mu, scale=sigma)))


def interval_report(y: np.ndarray, mu: np.ndarray, sigma: np.ndarray | None, lower: np.ndarray,
                    upper: np.ndarray) -> dict[str, float]:
    """Every metric of one task: coverage, mean_width, width_over_rmse, and with a spread, miscalibration_area,
    ence, spearman and nll (of ``sigma`` as given: pass the z-scaled sigma for a calibrated NLL)."""
    report = {"coverage": coverage(y, lower, upper), "mean_width": mean_width(lower, upper),
              "width_over_rmse": width_over_rmse(y, mu, lower, upper)}
    if sigma is not None:
        report.update(miscalibration_area=miscalibration_area(y, mu, sigma), ence=ence(y, mu, sigma),
                      spearman=error_sigma_spearman(y, mu, sigma), nll=gaussian_nll(y, mu, sigma))
    return report


# Binary classification: ``y`` labels 0/1, ``p`` the probability of class 1, ``sets`` prediction sets as written in
# ``<task>_set`` ("0", "1", "0,1", ""; None for an invalid molecule). Unlabelled rows (NaN) are left out.

def expected_calibration_error(y: np.ndarray, p: np.ndarray, bins: int = 10) -> float:
    """ECE of the probability of class 1 (not the top-label confidence): ``bins`` equal-width bins of ``p`` on
    [0, 1]; sum over bins of (fraction of molecules in the bin) x |fraction of positives - mean p|. 0: calibrated."""
    y, p = _kept(y, p)
    if not len(y):
        return float("nan")
    where = np.clip(np.floor(p * bins).astype(int), 0, bins - 1)  # p = 1 joins the last bin
    total = 0.0
    for b in np.unique(where):
        part = where == b
        total += part.mean() * abs(y[part].mean() - p[part].mean())
    return float(total)


def brier_score(y: np.ndarray, p: np.ndarray) -> float:
    """Mean squared difference of p and the label (scikit-learn's brier_score_loss; 0 best, 0.25 a coin flip)."""
    y, p = _kept(y, p)
    from sklearn.metrics import brier_score_loss

    return float(brier_score_loss(y.astype(int), p, pos_label=1)) if len(y) else float("nan")


def _labelled_sets(y: np.ndarray, sets) -> tuple[np.ndarray, list[str]]:
    y = np.asarray(y, dtype=np.float64)
    keep = [i for i, s in enumerate(sets) if s is not None and not np.isnan(y[i])]
    return y[keep], [sets[i] for i in keep]


def set_coverage(y: np.ndarray, sets) -> float:
    """The fraction of labelled molecules whose class is in their prediction set."""
    y, sets = _labelled_sets(y, sets)
    return float(np.mean([str(int(label)) in s.split(",") for label, s in zip(y, sets)])) if sets else float("nan")


def set_sizes(sets) -> np.ndarray:
    return np.array([len(s.split(",")) if s else 0 for s in sets if s is not None], dtype=np.float64)


def set_report(y: np.ndarray, sets) -> dict[str, float]:
    """Coverage, mean set size and the fractions of singleton and empty sets, over the labelled molecules."""
    y, sets = _labelled_sets(y, sets)
    sizes = set_sizes(sets)
    if not len(sizes):
        return {"set_coverage": float("nan"), "mean_set_size": float("nan"), "singleton_fraction": float("nan"),
                "empty_fraction": float("nan")}
    return {"set_coverage": set_coverage(y, sets), "mean_set_size": float(sizes.mean()),
            "singleton_fraction": float(np.mean(sizes == 1)), "empty_fraction": float(np.mean(sizes == 0))}


def probability_report(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    return {"ece": expected_calibration_error(y, p), "brier": brier_score(y, p)}
