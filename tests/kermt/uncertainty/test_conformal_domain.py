"""Mondrian conformal by applicability-domain distance (``mondrian_domain``): coverage within each distance bin on
synthetic data whose noise grows with the distance, where the ensemble's spread does not see it; the JSON round
trip, the folds' pooling and the bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kermt.errors import UserError
from kermt.uncertainty import fit_calibration, intervals, load_calibrations, save_calibrations
from kermt.uncertainty.metrics import coverage
from kermt.uncertainty.run_calibration import pooled


def far_is_harder(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mu, y, sigma, distance): the noise std is 0.2 + distance (distance uniform in [0, 2]); the spread tracks
    the noise only loosely (a lognormal factor of 0.6), as an ensemble's spread on new scaffolds does."""
    rng = np.random.default_rng(seed)
    distance = 2 * rng.random(n)
    mu = rng.normal(size=n)
    y = mu + (0.2 + distance) * rng.normal(size=n)
    sigma = 0.3 * np.exp(0.6 * rng.normal(size=n)) * (0.2 + distance) ** 0.25
    return mu, y, sigma, distance


def test_covers_within_each_distance_bin_where_normalised_does_not():
    mu_c, y_c, s_c, d_c = far_is_harder(3000, seed=1)
    mu_t, y_t, s_t, d_t = far_is_harder(30000, seed=2)
    domain = fit_calibration("logS", mu_c, y_c, s_c, method="mondrian_domain", distance=d_c)
    normalised = fit_calibration("logS", mu_c, y_c, s_c)
    assert domain.needs_distance and not normalised.needs_distance
    assert len(domain.bin_edges()) == 2 and np.allclose(domain.bin_edges(), [2 / 3, 4 / 3], atol=0.05)
    lo_d, hi_d = intervals(domain, mu_t, s_t, 0.9, distance=d_t)
    lo_n, hi_n = intervals(normalised, mu_t, s_t, 0.9)
    tercile = np.searchsorted([2 / 3, 4 / 3], d_t)
    for b in range(3):
        inside = tercile == b
        assert abs(coverage(y_t[inside], lo_d[inside], hi_d[inside]) - 0.9) < 0.03, b
    far, near = tercile == 2, tercile == 0
    assert coverage(y_t[far], lo_n[far], hi_n[far]) < 0.85  # one quantile: the far pay for the near
    assert coverage(y_t[near], lo_n[near], hi_n[near]) > 0.95
    assert abs(coverage(y_t, lo_d, hi_d) - 0.9) < 0.02
    # the interval still follows the spread inside a bin: twice the sigma, twice the half-width
    mid = intervals(domain, np.zeros(2), np.array([0.5, 1.0]), 0.9, distance=np.array([1.0, 1.0]))[1]
    assert mid[1] == pytest.approx(2 * mid[0])


def test_beyond_every_calibration_molecule_takes_the_farthest_bin():
    mu, y, sigma, distance = far_is_harder(300, seed=3)
    domain = fit_calibration("t", mu, y, sigma, method="mondrian_domain", distance=distance)
    far = intervals(domain, np.zeros(2), np.ones(2), 0.9, distance=np.array([distance.max(), 100.0]))[1]
    assert far[0] == far[1] == pytest.approx(domain.bin_quantiles(0.9)[-1])


def test_round_trips_pools_and_one_bin_for_small_sets(tmp_path):
    mu, y, sigma, distance = far_is_harder(400, seed=4)
    halves = [fit_calibration("t", mu[i::2], y[i::2], sigma[i::2], method="mondrian_domain",
                              distance=distance[i::2]) for i in (0, 1)]
    path = str(tmp_path / "calibration.json")
    save_calibrations(path, {"t": halves[0]}, source="synthetic")
    assert load_calibrations(path)["t"] == halves[0]
    merged = pooled(halves)
    assert merged.n == 400 and list(merged.scores) == sorted(merged.scores) and merged.sigmas is None
    assert sorted(zip(merged.scores, merged.distances)) == sorted(
        pair for h in halves for pair in zip(h.scores, h.distances))
    small = fit_calibration("t", mu[:50], y[:50], sigma[:50], method="mondrian_domain", distance=distance[:50])
    assert len(small.bin_edges()) == 0  # 50 molecules: one bin, the normalised quantile
    assert np.allclose(intervals(small, mu, sigma, 0.8, distance=distance)[1],
                       intervals(fit_calibration("t", mu[:50], y[:50], sigma[:50]), mu, sigma, 0.8)[1])
    record = json.loads(open(path).read())
    record["tasks"]["t"]["distances"] = record["tasks"]["t"]["distances"][1:]
    (tmp_path / "broken.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"tasks\.t\.distances' must list one non-negative distance per score"):
        load_calibrations(str(tmp_path / "broken.json"))


def test_a_distance_is_needed_and_checked():
    mu, y, sigma, distance = far_is_harder(100, seed=5)
    with pytest.raises(UserError, match="val.csv: column 't': method 'mondrian_domain' needs each molecule's"):
        fit_calibration("t", mu, y, sigma, method="mondrian_domain", source="val.csv")
    bad = distance.copy()
    bad[3] = np.nan
    with pytest.raises(UserError, match=r"1 applicability-domain distance\(s\) are NaN, infinite or negative"):
        fit_calibration("t", mu, y, sigma, method="mondrian_domain", distance=bad)
    y_unlabelled = y.copy()
    y_unlabelled[3] = np.nan  # an unlabelled molecule's distance is not read
    fit_calibration("t", mu, y_unlabelled, sigma, method="mondrian_domain", distance=bad)
    domain = fit_calibration("t", mu, y, sigma, method="mondrian_domain", distance=distance)
    with pytest.raises(UserError, match="its mondrian_domain calibration needs each molecule's applicability"):
        intervals(domain, mu, sigma, 0.9)
    mu_invalid = mu.copy()
    mu_invalid[3] = np.nan  # an invalid molecule has no distance either: NaN bounds, no error
    lower, _ = intervals(domain, mu_invalid, sigma, 0.9, distance=bad)
    assert np.isnan(lower[3]) and np.isfinite(np.delete(lower, 3)).all()
