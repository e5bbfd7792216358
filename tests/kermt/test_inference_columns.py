"""kermt.inference.columns: the columns of a prediction, their order, their values and the ensemble's mean and
spread, checked against the library functions they stand for (the runners' tests check the files and responses)."""

from __future__ import annotations

import numpy as np

from kermt.inference.columns import OutputPlan, ensemble_mean, ensemble_spread, prediction_columns
from kermt.uncertainty import fit_calibration, fit_class_calibration, intervals

RNG = np.random.default_rng(7)
TASKS = ("t1", "t2")


def _regression_calibrations() -> dict:
    mu, sigma = RNG.normal(size=(40, 2)), RNG.uniform(0.1, 1.0, size=(40, 2))
    y = mu + RNG.normal(size=(40, 2)) * sigma
    return {task: fit_calibration(task, mu[:, t], y[:, t], sigma[:, t]) for t, task in enumerate(TASKS)}


def _class_calibrations() -> dict:
    p = RNG.uniform(0.05, 0.95, size=(60, 2))
    y = (RNG.uniform(size=(60, 2)) < p).astype(float)
    return {task: fit_class_calibration(task, p[:, t], y[:, t]) for t, task in enumerate(TASKS)}


def test_a_regression_plan_names_its_columns_in_kermt_predicts_order():
    plan = OutputPlan(TASKS, regression=True, uncertainty=True, interval=0.9,
                      calibrations=_regression_calibrations(), domain=True)
    assert plan.names() == ["t1", "t2", "t1_std", "t2_std", "t1_lower", "t1_upper", "t2_lower", "t2_upper",
                            "domain_distance", "in_domain"]
    # a calibration without a level writes no bounds; a level without a calibration neither
    assert OutputPlan(TASKS, True, calibrations=_regression_calibrations()).names() == ["t1", "t2"]
    assert OutputPlan(TASKS, True, interval=0.9).names() == ["t1", "t2"]
    # a calibration that is fitted later (--calibration_path) is named before it exists
    assert OutputPlan(TASKS, True, interval=0.9, calibrated=True).names()[2:] == ["t1_lower", "t1_upper",
                                                                                  "t2_lower", "t2_upper"]


def test_a_classifier_plan_names_calibrated_probabilities_then_sets():
    calibrations = _class_calibrations()
    assert OutputPlan(TASKS, False, class_calibrations=calibrations).names() == ["t1", "t2", "t1_calibrated",
                                                                                 "t2_calibrated"]
    assert OutputPlan(TASKS, False, interval=0.8, class_calibrations=calibrations).names() == [
        "t1", "t2", "t1_calibrated", "t2_calibrated", "t1_set", "t2_set"]


def test_regression_values_are_the_calibrations_intervals_and_invalid_rows_are_empty():
    calibrations = _regression_calibrations()
    plan = OutputPlan(TASKS, True, uncertainty=True, interval=0.8, calibrations=calibrations, domain=True)
    mean, std = RNG.normal(size=(5, 2)), RNG.uniform(0.1, 1.0, size=(5, 2))
    valid = np.array([True, False, True, True, False])
    mean[~valid] = np.nan  # as an ensemble leaves an invalid molecule's row
    distances, inside = RNG.uniform(size=5), np.array([True, False, False, True, False])
    columns = prediction_columns(plan, mean, std, valid, (distances, inside))
    assert list(columns) == plan.names()
    for t, task in enumerate(TASKS):
        lower, upper = intervals(calibrations[task], mean[:, t], std[:, t], 0.8)
        np.testing.assert_array_equal(columns[f"{task}_lower"], lower)
        np.testing.assert_array_equal(columns[f"{task}_upper"], upper)
        np.testing.assert_array_equal(columns[task][valid], mean[valid, t])
        np.testing.assert_array_equal(columns[f"{task}_std"][valid], std[valid, t])
        assert np.isnan(columns[f"{task}_std"][~valid]).all() and np.isnan(columns[f"{task}_lower"][~valid]).all()
        assert (columns[f"{task}_upper"][valid] > columns[f"{task}_lower"][valid]).all()
    assert columns["in_domain"] is inside and columns["domain_distance"] is distances


def test_classifier_values_are_the_calibrations_probabilities_and_sets():
    calibrations = _class_calibrations()
    plan = OutputPlan(TASKS, False, interval=0.9, class_calibrations=calibrations)
    mean = np.array([[0.1, 0.9], [np.nan, np.nan], [0.6, 0.4]])
    valid = np.array([True, False, True])
    columns = prediction_columns(plan, mean, np.zeros_like(mean), valid)
    for t, task in enumerate(TASKS):
        np.testing.assert_array_equal(columns[f"{task}_calibrated"], calibrations[task].calibrated(mean[:, t]))
        assert list(columns[f"{task}_set"]) == calibrations[task].sets(mean[:, t], 0.9)
        assert columns[f"{task}_set"][1] is None and all(isinstance(s, str) for s in columns[f"{task}_set"][[0, 2]])


def test_ensemble_mean_sums_in_member_order_and_the_spread_is_the_population_std():
    members = [RNG.normal(size=(30, 2)) * 10 ** k for k in range(4)]  # magnitudes where the order of sums shows
    total = np.zeros((30, 2))
    for preds in members:
        total += preds
    assert np.array_equal(ensemble_mean(members), total / 4)
    np.testing.assert_allclose(ensemble_spread(members), np.std(np.stack(members), axis=0, ddof=0), rtol=1e-12)
