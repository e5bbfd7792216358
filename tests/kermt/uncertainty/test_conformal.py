"""Split conformal regression on synthetic heteroscedastic data (the noise of each molecule known), the JSON
round trip and the bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kermt.errors import UserError
from kermt.uncertainty import Calibration, fit_calibration, intervals, load_calibrations, save_calibrations
from kermt.uncertainty.metrics import coverage, mean_width


def heteroscedastic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mu, y, sigma): noise std from 0.05 to 2 per molecule; the estimated sigma is right only up to a factor of
    0.3 (an ensemble's spread is too narrow) and a 30 % lognormal error per molecule."""
    rng = np.random.default_rng(seed)
    true_sigma = 0.05 + 1.95 * rng.random(n) ** 2
    mu = rng.normal(size=n)
    y = mu + true_sigma * rng.normal(size=n)
    sigma = 0.3 * true_sigma * np.exp(0.3 * rng.normal(size=n))
    return mu, y, sigma


@pytest.fixture(scope="module")
def calibration_and_test():
    return heteroscedastic(2000, seed=1), heteroscedastic(20000, seed=2)


def test_normalised_covers_and_adapts(calibration_and_test):
    (mu_c, y_c, s_c), (mu_t, y_t, s_t) = calibration_and_test
    normalised = fit_calibration("logS", mu_c, y_c, s_c)
    plain = fit_calibration("logS", mu_c, y_c, s_c, method="plain")
    lo_n, hi_n = intervals(normalised, mu_t, s_t, 0.9)
    lo_p, hi_p = intervals(plain, mu_t, s_t, 0.9)
    assert normalised.method == "normalised" and normalised.n == 2000
    assert abs(coverage(y_t, lo_n, hi_n) - 0.9) < 0.03
    assert abs(coverage(y_t, lo_p, hi_p) - 0.9) < 0.03
    confident = s_t < np.quantile(s_t, 0.25)
    assert mean_width(lo_n[confident], hi_n[confident]) < 0.5 * mean_width(lo_p[confident], hi_p[confident])
    assert coverage(y_t[confident], lo_n[confident], hi_n[confident]) > 0.85  # plain over-covers these
    assert mean_width(lo_n, hi_n) < mean_width(lo_p, hi_p)
    assert np.all(lo_n <= mu_t) and np.all(mu_t <= hi_n)
    assert np.ptp(hi_p - lo_p) < 1e-12  # plain: one width for every molecule


def test_zscaling_recovers_the_spread_factor(calibration_and_test):
    (mu_c, y_c, s_c), (mu_t, y_t, s_t) = calibration_and_test
    scaled = fit_calibration("logS", mu_c, y_c, s_c, method="zscaling")
    assert 3.0 < scaled.z_scale < 3.9  # the estimate is 0.3 x the truth (with lognormal noise on top)
    lo, hi = intervals(scaled, mu_t, s_t, 0.9)
    assert 0.8 < coverage(y_t, lo, hi) < 0.97


def test_finite_sample_quantile():
    scores = np.arange(1.0, 21.0)  # residuals 1..20 with mu = 0
    calibration = fit_calibration("t", np.zeros(20), scores, None, method="plain")
    assert calibration.quantile(0.9) == 19.0  # ceil(21 * 0.9) = 19th smallest
    assert calibration.quantile(0.95) == 20.0
    assert calibration.quantile(0.5) == 11.0
    with pytest.raises(UserError, match="needs at least 24"):
        calibration.quantile(0.96)


def test_nan_labels_are_skipped():
    mu, y, sigma = heteroscedastic(60, seed=3)
    y[::2] = np.nan
    assert fit_calibration("t", mu, y, sigma).n == 30


def test_json_round_trip_serves_any_level(tmp_path, calibration_and_test):
    (mu_c, y_c, s_c), (mu_t, _, s_t) = calibration_and_test
    fitted = {"a": fit_calibration("a", mu_c, y_c, s_c), "b": fit_calibration("b", mu_c, y_c, s_c, method="plain")}
    path = str(tmp_path / "calibration.json")
    save_calibrations(path, fitted, source="synthetic")
    loaded = load_calibrations(path)
    assert loaded == fitted
    for level in (0.5, 0.8, 0.95):
        assert np.array_equal(intervals(loaded["a"], mu_t, s_t, level)[1], intervals(fitted["a"], mu_t, s_t, level)[1])
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]  # no staging file left


def test_too_few_labelled_rows_names_the_column():
    mu, y, sigma = heteroscedastic(30, seed=4)
    y[:15] = np.nan
    with pytest.raises(UserError, match=r"fold_0 validation split: column 'logS' has 15 labelled.*at least 20"):
        fit_calibration("logS", mu, y, sigma, source="fold_0 validation split")


def test_too_few_labelled_rows_advises_the_callers_flag():
    """kermt finetune sizes its validation split with --split_sizes, kermt explore with --validation_share, and a
    calibration file has no split: each caller's message names its own (regression and classification alike)."""
    from kermt.uncertainty.classification import fit_class_calibrations

    mu, y, sigma = heteroscedastic(30, seed=4)
    y[:15] = np.nan
    labels = np.where(np.isnan(y), np.nan, (y > np.nanmedian(y)).astype(float))[:, None]
    probs = np.full((30, 1), 0.5)
    for flag, advice in (("--split_sizes", "use a larger validation split (--split_sizes) or more labelled molecules"),
                         ("--validation_share", "use a larger validation split (--validation_share) or more labelled "
                          "molecules"),
                         (None, "use more labelled molecules")):
        with pytest.raises(UserError) as regression:
            fit_calibration("logS", mu, y, sigma, split_flag=flag)
        with pytest.raises(UserError) as classification:
            fit_class_calibrations(["logS"], probs, labels, split_flag=flag)
        for caught in (regression, classification):
            assert str(caught.value).endswith(f"at least 20: {advice}")
    with pytest.raises(UserError, match=r"\(--split_sizes\)"):  # finetune's flag unless told otherwise
        fit_calibration("logS", mu, y, sigma)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -0.1])
def test_bad_sigma_is_an_error(bad):
    mu, y, sigma = heteroscedastic(40, seed=5)
    sigma[7] = bad
    with pytest.raises(UserError, match="column 'logS': 1 sigma value"):
        fit_calibration("logS", mu, y, sigma)
    calibration = fit_calibration("logS", mu, y, heteroscedastic(40, seed=5)[2])
    with pytest.raises(UserError, match="the predictions: column 'logS'"):
        intervals(calibration, mu, sigma, 0.9)


def test_zero_sigma_floors_or_needs_plain():
    mu, y, sigma = heteroscedastic(40, seed=6)
    sigma[3] = 0.0  # members that agree exactly: floored, the interval is narrow but not empty
    calibration = fit_calibration("t", mu, y, sigma)
    lower, upper = intervals(calibration, mu, sigma, 0.9)
    assert upper[3] - lower[3] > 0 and calibration.sigma_floor == pytest.approx(0.01 * np.median(sigma[sigma > 0]))
    with pytest.raises(UserError, match="every sigma is 0.*use method 'plain'"):
        fit_calibration("t", mu, y, np.zeros(40))


@pytest.mark.parametrize("level", [0.0, 1.0, 1.5, -0.2])
def test_level_outside_zero_one(level):
    calibration = fit_calibration("t", np.zeros(20), np.arange(20.0), None, method="plain")
    with pytest.raises(UserError, match=f"--interval {level}: .*strictly between 0 and 1"):
        intervals(calibration, np.zeros(3), None, level)


def test_invalid_molecules_get_nan_bounds():
    mu, y, sigma = heteroscedastic(40, seed=7)
    calibration = fit_calibration("t", mu, y, sigma)
    lower, upper = intervals(calibration, np.array([0.0, np.nan]), np.array([0.5, np.nan]), 0.9)
    assert np.isfinite(lower[0]) and np.isnan(lower[1]) and np.isnan(upper[1])


def test_malformed_files_name_file_and_key(tmp_path):
    path = tmp_path / "calibration.json"
    with pytest.raises(UserError, match="does not exist"):
        load_calibrations(str(path))
    path.write_text("{not json")
    with pytest.raises(UserError, match="not readable JSON"):
        load_calibrations(str(path))
    good = {"format": "kermt-calibration", "version": 1, "source": "x",
            "tasks": {"t": {"method": "normalised", "scores": [0.1, 0.2], "z_scale": 1.0, "sigma_floor": 0.01}}}
    for key, value, message in [("method", "magic", r"tasks\.t\.method"),
                                ("scores", [0.3, 0.1], r"tasks\.t\.scores' must be sorted"),
                                ("scores", [], r"tasks\.t\.scores"), ("sigma_floor", None, r"tasks\.t\.sigma_floor")]:
        broken = json.loads(json.dumps(good))
        broken["tasks"]["t"][key] = value
        path.write_text(json.dumps(broken))
        with pytest.raises(UserError, match=rf"{path}: key '{message}"):
            load_calibrations(str(path))
    path.write_text(json.dumps(good))
    assert load_calibrations(str(path))["t"] == Calibration("t", "normalised", (0.1, 0.2), 1.0, 0.01)


def sublinear_spread(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mu, y, sigma) where the estimated sigma grows only as the square root of the true noise: normalised scores
    are then larger for uncertain molecules than for confident ones (one quantile cannot fit both)."""
    rng = np.random.default_rng(seed)
    true_sigma = 0.05 + 1.95 * rng.random(n) ** 2
    mu = rng.normal(size=n)
    return mu, mu + true_sigma * rng.normal(size=n), 0.3 * np.sqrt(true_sigma) * np.exp(0.2 * rng.normal(size=n))


def test_mondrian_covers_within_each_sigma_bin_where_normalised_does_not():
    mu_c, y_c, s_c = sublinear_spread(3000, seed=4)
    mu_t, y_t, s_t = sublinear_spread(30000, seed=5)
    mondrian = fit_calibration("logS", mu_c, y_c, s_c, method="mondrian")
    normalised = fit_calibration("logS", mu_c, y_c, s_c)
    assert len(mondrian.bin_edges()) == 2 and len(mondrian.sigmas) == 3000
    lo_m, hi_m = intervals(mondrian, mu_t, s_t, 0.9)
    lo_n, hi_n = intervals(normalised, mu_t, s_t, 0.9)
    tercile = np.searchsorted(np.quantile(s_t, [1 / 3, 2 / 3]), s_t)
    for b in range(3):
        inside = tercile == b
        assert abs(coverage(y_t[inside], lo_m[inside], hi_m[inside]) - 0.9) < 0.03, b
    top = tercile == 2
    assert coverage(y_t[top], lo_n[top], hi_n[top]) < 0.86  # normalised pays for the confident with these
    assert abs(coverage(y_t, lo_m, hi_m) - 0.9) < 0.02


def test_mondrian_round_trips_pools_and_shrinks_its_bins_for_small_sets(tmp_path):
    from kermt.uncertainty.run_calibration import pooled

    mu, y, sigma = sublinear_spread(400, seed=6)
    halves = [fit_calibration("t", mu[i::2], y[i::2], sigma[i::2], method="mondrian") for i in (0, 1)]
    path = str(tmp_path / "calibration.json")
    save_calibrations(path, {"t": halves[0]}, source="synthetic")
    assert load_calibrations(path)["t"] == halves[0]
    merged = pooled(halves)
    assert merged.n == 400 and list(merged.scores) == sorted(merged.scores)
    assert sorted(zip(merged.scores, merged.sigmas)) == sorted(
        pair for h in halves for pair in zip(h.scores, h.sigmas))
    small = fit_calibration("t", mu[:50], y[:50], sigma[:50], method="mondrian")
    assert len(small.bin_edges()) == 0  # 50 molecules: one bin, the normalised quantile
    assert np.allclose(intervals(small, mu, sigma, 0.8)[1],
                       intervals(fit_calibration("t", mu[:50], y[:50], sigma[:50]), mu, sigma, 0.8)[1])
    record = json.loads(open(path).read())
    del record["tasks"]["t"]["sigmas"]
    (tmp_path / "broken.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"tasks\.t\.sigmas' must list one positive sigma per score"):
        load_calibrations(str(tmp_path / "broken.json"))
