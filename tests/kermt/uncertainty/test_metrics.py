"""Uncertainty metrics against values worked out by hand or known for Gaussian data."""

from __future__ import annotations

import numpy as np
import pytest

from kermt.uncertainty import metrics


def test_coverage_width_and_ratio():
    y = np.array([0.0, 1.0, 2.0, np.nan])
    mu = np.array([0.0, 0.0, 0.0, 0.0])
    lower, upper = mu - 1.5, mu + 1.5
    assert metrics.coverage(y, lower, upper) == pytest.approx(2 / 3)  # the NaN label is left out
    assert metrics.mean_width(lower[:3], upper[:3]) == 3.0
    assert metrics.width_over_rmse(y, mu, lower, upper) == pytest.approx(3.0 / np.sqrt(5 / 3))


def test_calibrated_gaussian_scores_well_and_a_too_narrow_one_badly():
    rng = np.random.default_rng(0)
    sigma = 0.1 + rng.random(20000)
    mu = rng.normal(size=20000)
    y = mu + sigma * rng.normal(size=20000)
    assert metrics.miscalibration_area(y, mu, sigma) < 0.01
    assert metrics.miscalibration_area(y, mu, 0.3 * sigma) > 0.2
    assert metrics.ence(y, mu, sigma) < 0.05
    assert metrics.ence(y, mu, 0.3 * sigma) == pytest.approx(7 / 3, rel=0.1)  # RMSE / RMV = 1 / 0.3 in every bin
    assert metrics.error_sigma_spearman(y, mu, sigma) > 0.3
    assert abs(metrics.error_sigma_spearman(y, mu, rng.random(20000))) < 0.03
    expected_nll = np.mean(np.log(sigma)) + 0.5 * np.log(2 * np.pi) + 0.5
    assert metrics.gaussian_nll(y, mu, sigma) == pytest.approx(expected_nll, abs=0.02)
    assert metrics.gaussian_nll(y, mu, 0.3 * sigma) > metrics.gaussian_nll(y, mu, sigma) + 1


def test_report_and_degenerate_inputs():
    y = np.arange(30.0)
    report = metrics.interval_report(y, y + 0.5, None, y - 1, y + 1)
    assert report == {"coverage": 1.0, "mean_width": 2.0, "width_over_rmse": 4.0}
    assert np.isnan(metrics.error_sigma_spearman(y, y, np.ones(30)))  # a constant sigma ranks nothing
    assert np.isnan(metrics.coverage(np.full(3, np.nan), np.zeros(3), np.ones(3)))
    full = metrics.interval_report(y, y + 0.5, np.full(30, 0.5), y - 1, y + 1)
    assert set(full) == {"coverage", "mean_width", "width_over_rmse", "miscalibration_area", "ence", "spearman", "nll"}
