"""Random selection's exact expectations when the whole library's scores are known (a ``lookup:`` objective): what
picking ``n`` of the library's ``N`` rows uniformly at random, without replacement, finds on average.

- The share of the true top-K found: the number of them among the picks is hypergeometric (N rows, K of them
  marked, n drawn), so the expected share is its mean over K (``n / N`` whatever K).
- The best score, and the mean of the best k, among the picks: with the scored rows ranked best first, rank i is
  among the picks' best k when it is picked (``n / N``) and fewer than k of the i - 1 rows ranked above it are among
  the other n - 1 picks (a hypergeometric cdf over the other N - 1 rows). Rows without a score count in N (random
  selection picks them too) and never in a best.

With no scores known beyond the explored ones, the report estimates these from round 0 instead
(``ray_app.report.explore``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln
from scipy.stats import hypergeom

TRUE_TOP_SHARE = 0.01  # "the true top 1 %": MolPAL's measure of what a search found


def ranked_best_first(scores: np.ndarray, minimize: bool) -> np.ndarray:
    """The rows of ``scores`` with a finite score, best first (ties: the lower row first)."""
    scores = np.asarray(scores, dtype=np.float64)
    rows = np.flatnonzero(np.isfinite(scores))
    return rows[np.lexsort((rows, scores[rows] if minimize else -scores[rows]))]


def true_top_rows(scores: np.ndarray, minimize: bool, share: float = TRUE_TOP_SHARE) -> np.ndarray:
    """The library rows of the true top ``share`` of the scored molecules (at least one; ties at the cut: the lower
    rows)."""
    ranked = ranked_best_first(scores, minimize)
    return ranked[:max(1, math.ceil(share * len(ranked)))] if len(ranked) else ranked


def expected_found_share(library_rows: int, top: int, picked: int) -> float:
    """The expected share of ``top`` marked rows among ``picked`` rows drawn at random from ``library_rows``."""
    if top == 0:
        return float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):  # scipy's higher moments divide by zero when all are drawn
        return float(hypergeom(library_rows, top, min(picked, library_rows)).mean()) / top


def expected_best_mean(scores: np.ndarray, minimize: bool, picked: int, k: int = 1) -> float:
    """The expected mean of the best ``k`` scores among ``picked`` rows drawn at random from all of ``scores``'s
    rows (NaN: a row without a score): the expected sum of the picks' best k over their expected count (exact
    whenever the picks hold k scored rows, which is all but certain past tiny draws). NaN when none can be
    scored."""
    scores = np.asarray(scores, dtype=np.float64)
    total, picked = len(scores), min(picked, len(scores))
    ranked = ranked_best_first(scores, minimize)
    if picked == 0 or not len(ranked):
        return float("nan")
    above = np.arange(len(ranked))  # rank i (0-based) has i scored rows ranked above it
    if picked == total:  # every row picked (scipy's hypergeom wants at least one row left to draw from)
        weights = (above < k).astype(np.float64)
    else:
        weights = picked / total * _fewer_than_k_above(total - 1, picked - 1, above, k)
    return float(np.dot(weights, scores[ranked]) / weights.sum())


def _fewer_than_k_above(rows: int, draws: int, above: np.ndarray, k: int) -> np.ndarray:
    """``hypergeom(rows, above, draws).cdf(k - 1)`` for every count ``above``: the chance that fewer than k of them
    are among ``draws`` rows drawn from ``rows``. Summed from log binomials, k terms of whole-array arithmetic:
    scipy's cdf took 7 s at 20,000 rows and minutes at 100,000 (the report of a 10^5-molecule exploration). Its
    relative error grows with the size (log binomials of about rows * log(rows)): about 1e-9 at 10^6 rows."""
    log_all = _log_choose(rows, draws)
    cdf = np.zeros(len(above))
    for x in range(min(k, draws + 1)):
        possible = (above >= x) & (rows - above >= draws - x)  # else no way to draw x of them
        a = above[possible].astype(np.float64)
        cdf[possible] += np.exp(_log_choose(a, x) + _log_choose(rows - a, draws - x) - log_all)
    return np.minimum(cdf, 1.0)


def _log_choose(n, r):
    return gammaln(np.add(n, 1)) - gammaln(np.add(r, 1)) - gammaln(np.subtract(n, r) + 1)


__all__ = ["TRUE_TOP_SHARE", "expected_best_mean", "expected_found_share", "ranked_best_first", "true_top_rows"]
