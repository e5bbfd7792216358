"""Acquisition values against hand-computed ones, in both directions, and the batch they choose."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kermt.errors import UserError
from kermt.explore.acquisition import (ACQUISITION_FUNCTIONS, IMPROVEMENT_MARGIN, Surrogate, acquisition_values,
                                       best_score, check_uncertainty, random_batch, round_rng, top_batch)
from kermt.registry import ACQUISITIONS, UNCERTAIN_ACQUISITIONS

MEAN = np.array([1.0, 2.0, 3.0, np.nan])
STD = np.array([0.5, 0.0, 2.0, 1.0])


def _phi(z):
    return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def _cdf(z):
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def values(name, best=2.0, minimize=False, mean=MEAN, std=STD, beta=2.0, seed=0):
    return acquisition_values(name, Surrogate(mean, std), best, round_rng(seed, 1), beta=beta, minimize=minimize)


def test_every_registered_acquisition_has_a_function():
    assert tuple(ACQUISITION_FUNCTIONS) == ACQUISITIONS
    assert UNCERTAIN_ACQUISITIONS < set(ACQUISITIONS)


def test_greedy_and_ucb_are_the_mean_and_the_mean_plus_beta_std():
    np.testing.assert_array_equal(values("greedy"), [1.0, 2.0, 3.0, np.nan])
    np.testing.assert_array_equal(values("ucb", beta=3.0), [2.5, 2.0, 9.0, np.nan])
    np.testing.assert_array_equal(values("ucb", minimize=True), [0.0, -2.0, 1.0, np.nan])  # -mean + 2 std


def test_ei_and_pi_are_the_closed_forms_over_the_best_score():
    best, xi = 2.0, IMPROVEMENT_MARGIN
    expected_ei, expected_pi = [], []
    for m, s in zip(MEAN[:3], STD[:3]):
        gain = m - best - xi
        expected_ei.append(gain * _cdf(gain / s) + s * _phi(gain / s) if s > 0 else max(gain, 0.0))
        expected_pi.append(_cdf(gain / s) if s > 0 else float(gain > 0))
    np.testing.assert_allclose(values("ei", best)[:3], expected_ei, rtol=1e-12)
    np.testing.assert_allclose(values("pi", best)[:3], expected_pi, rtol=1e-12)
    assert np.isnan(values("ei", best)[3])
    assert values("ei")[2] == pytest.approx(1.38869, abs=1e-5)  # 0.99 * Phi(0.495) + 2 * phi(0.495)


def test_minimize_mirrors_the_scores():
    """Minimising scores s is maximising -s: the same values as the negated problem."""
    for name in ("greedy", "ucb", "ei", "pi", "thompson"):
        np.testing.assert_allclose(values(name, best=1.5, minimize=True),
                                   values(name, best=-1.5, mean=-MEAN), rtol=1e-12)


def test_thompson_draws_from_the_prediction_seeded_by_round():
    draws = values("thompson", mean=np.zeros(20_000), std=np.full(20_000, 2.0))
    assert abs(draws.mean()) < 0.05 and draws.std() == pytest.approx(2.0, rel=0.02)
    np.testing.assert_array_equal(draws, values("thompson", mean=np.zeros(20_000), std=np.full(20_000, 2.0)))
    assert not np.array_equal(draws, values("thompson", mean=np.zeros(20_000), std=np.full(20_000, 2.0), seed=1))


def test_before_any_score_ei_is_the_mean_and_pi_is_one():
    np.testing.assert_array_equal(values("ei", best=math.nan), MEAN)
    np.testing.assert_array_equal(values("pi", best=math.nan)[:3], [1.0, 1.0, 1.0])


def test_an_acquisition_without_the_uncertainty_it_needs_is_one_line():
    check_uncertainty("greedy", False, "x")
    with pytest.raises(UserError, match=r"^--acquisition ucb needs the surrogate's uncertainty, and one model has "
                                        r"no spread; use --acquisition greedy or random"):
        check_uncertainty("ucb", False, "one model has no spread")


def test_top_batch_takes_the_largest_unexcluded_values_ties_to_the_lower_row():
    v = np.array([5.0, 1.0, 7.0, 7.0, np.nan, 3.0, 7.0])
    excluded = np.array([False, False, False, True, False, False, False])
    np.testing.assert_array_equal(top_batch(v, excluded, 3), [2, 6, 0])
    np.testing.assert_array_equal(top_batch(v, excluded, 2), [2, 6])
    np.testing.assert_array_equal(top_batch(v, excluded, 10), [2, 6, 0, 5, 1])  # NaN never chosen


def test_random_batch_draws_without_replacement_from_the_rest():
    excluded = np.zeros(100, bool)
    excluded[:50] = True
    rows = random_batch(excluded, 20, round_rng(3, 0))
    assert len(set(rows.tolist())) == 20 and rows.min() >= 50
    np.testing.assert_array_equal(rows, random_batch(excluded, 20, round_rng(3, 0)))


def test_best_score_follows_the_direction():
    scores = np.array([np.nan, -3.0, 2.0])
    assert (best_score(scores, False), best_score(scores, True)) == (2.0, -3.0)
    assert math.isnan(best_score(np.array([np.nan]), False))
