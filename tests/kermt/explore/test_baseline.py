"""Random selection's exact expectations on a library whose every score is known (kermt.explore.baseline), against
every possible pick of a small library enumerated here and scipy's hypergeometric distribution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import hypergeom

from kermt.explore.baseline import expected_best_mean, expected_found_share, ranked_best_first, true_top_rows

# 9 rows, two without a score (random picks them too)
LIBRARY = np.array([3.0, np.nan, 1.0, 5.0, 2.0, np.nan, 4.0, 0.5, 2.5])


def _enumerated_best_mean(scores: np.ndarray, picked: int, k: int, minimize: bool) -> float:
    """The mean over every set of ``picked`` rows of the mean of its best k scores (sets with no score left out)."""
    means = []
    for rows in itertools.combinations(range(len(scores)), picked):
        finite = np.sort(scores[list(rows)][np.isfinite(scores[list(rows)])])
        if len(finite):
            means.append((finite if minimize else finite[::-1])[:k].mean())
    return float(np.mean(means))


@pytest.mark.parametrize("minimize", [False, True])
@pytest.mark.parametrize("picked", [1, 2, 4, 7, 9])
def test_the_expected_best_is_the_mean_over_every_possible_pick(picked, minimize):
    assert expected_best_mean(LIBRARY, minimize, picked) == pytest.approx(
        _enumerated_best_mean(LIBRARY, picked, 1, minimize), rel=1e-12)


@pytest.mark.parametrize("picked,k", [(4, 2), (7, 3), (9, 3), (6, 6)])
def test_the_expected_top_k_mean_is_exact_when_every_pick_holds_k_scores(picked, k):
    # 7 scored rows of 9: any pick of 7 or more holds at least 5 scores, a pick of 4 at least 2
    assert expected_best_mean(LIBRARY, False, picked, k) == pytest.approx(
        _enumerated_best_mean(LIBRARY, picked, k, False), rel=1e-12)


def test_the_share_of_the_true_top_found_is_the_hypergeometric_mean():
    scores = np.random.default_rng(3).normal(size=250)
    top = true_top_rows(scores, minimize=True, share=0.05)
    assert len(top) == 13 and set(top) == set(np.argsort(scores)[:13])
    for picked in (1, 10, 100, 249):
        expected = hypergeom(250, 13, picked).mean() / 13
        assert expected_found_share(250, 13, picked) == pytest.approx(expected, rel=1e-12)
        assert expected_found_share(250, 13, picked) == pytest.approx(picked / 250, rel=1e-12)
    assert expected_found_share(250, 13, 250) == 1.0 and expected_found_share(250, 13, 400) == 1.0


def test_ranking_skips_rows_without_a_score_and_breaks_ties_by_row():
    assert ranked_best_first(np.array([2.0, np.nan, 3.0, 2.0]), minimize=False).tolist() == [2, 0, 3]
    assert ranked_best_first(np.array([2.0, np.nan, 3.0, 2.0]), minimize=True).tolist() == [0, 3, 2]
    assert true_top_rows(np.array([np.nan, 1.0]), minimize=False).tolist() == [1]  # at least one


@pytest.mark.parametrize("k", [1, 10])
def test_the_expected_best_equals_scipys_hypergeometric_cdf_on_a_larger_library(k):
    """The weights come from log binomials (scipy's cdf took minutes at 10^5 rows): the same expectation as
    scipy's hypergeom(N - 1, i, n - 1).cdf(k - 1) on 3,000 rows, 300 of them without a score."""
    scores = np.random.default_rng(4).normal(size=3000)
    scores[np.random.default_rng(5).choice(3000, 300, replace=False)] = np.nan
    ranked = ranked_best_first(scores, minimize=False)
    for picked in (1, 2, 30, 1000, 2999):
        weights = hypergeom(2999, np.arange(len(ranked)), picked - 1).cdf(k - 1)
        expected = float(np.dot(weights, scores[ranked]) / weights.sum())
        assert expected_best_mean(scores, False, picked, k) == pytest.approx(expected, rel=1e-10)
