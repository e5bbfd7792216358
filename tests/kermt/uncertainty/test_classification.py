"""Classification calibration on synthetic, known-miscalibrated probabilities: the true probability of class 1 is
``t``, the model reports ``sigmoid(2·logit(t))`` (over-confident, as an ensemble of overfitted members is)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import expit, logit

from kermt.errors import UserError
from kermt.uncertainty import (class_calibration_record, fit_class_calibration, fit_class_calibrations,
                               load_class_calibrations, run_class_calibration, save_class_calibrations)
from kermt.uncertainty import metrics


def _draw(n: int, seed: int, bias: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth = expit(rng.normal(0.0, 1.5, size=n))
    labels = (rng.random(n) < truth).astype(np.float64)
    return expit(2 * logit(truth) + bias), labels


def test_ece_and_brier_against_hand_values():
    y = np.array([1.0, 0.0, 1.0, 0.0, np.nan])
    p = np.array([0.95, 0.05, 0.55, 0.45, 0.3])  # bins 9, 0, 5, 4: |1-0.95|, |0-0.05|, |1-0.55|, |0-0.45|
    assert metrics.expected_calibration_error(y, p) == pytest.approx((0.05 + 0.05 + 0.45 + 0.45) / 4)
    assert metrics.brier_score(y, p) == pytest.approx((0.05**2 * 2 + 0.45**2 * 2) / 4)
    assert metrics.expected_calibration_error(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == 0.0  # p = 1: last bin


@pytest.mark.parametrize("method, ece_after", [("platt", 0.015), ("isotonic", 0.03)])
def test_calibration_fixes_an_overconfident_model_on_held_out_data(method, ece_after):
    p_cal, y_cal = _draw(5000, seed=1, bias=0.5)
    p_test, y_test = _draw(20000, seed=2, bias=0.5)
    calibration = fit_class_calibration("active", p_cal, y_cal, method)
    before = metrics.expected_calibration_error(y_test, p_test)
    after = metrics.expected_calibration_error(y_test, calibration.calibrated(p_test))
    assert before > 0.1 and after < ece_after  # measured: 0.116 -> 0.0076 (platt), 0.021 (isotonic)
    assert metrics.brier_score(y_test, calibration.calibrated(p_test)) < metrics.brier_score(y_test, p_test) - 0.005
    if method == "platt":
        (a, b), = calibration.params
        assert a == pytest.approx(0.5, abs=0.08) and b == pytest.approx(-0.25, abs=0.1)  # the inverse of 2x + 0.5


@pytest.mark.parametrize("level", [0.8, 0.9, 0.95])
def test_prediction_sets_cover_at_the_nominal_level(level):
    p_cal, y_cal = _draw(1000, seed=3)
    p_test, y_test = _draw(20000, seed=4)
    calibration = fit_class_calibration("active", p_cal, y_cal)
    sets = calibration.sets(p_test, level)
    report = metrics.set_report(y_test, sets)
    assert level - 0.03 <= report["set_coverage"] <= level + 0.03
    assert set(sets) <= {"0", "1", "0,1", ""}
    assert 0 < report["singleton_fraction"] < 1 and 1 <= report["mean_set_size"] + report["empty_fraction"] <= 2


def test_sets_by_hand():
    calibration = fit_class_calibration("a", np.linspace(0.05, 0.95, 20), np.array([0, 1] * 10))
    q = calibration.quantile(0.5)
    assert calibration.sets(np.array([1 - q / 2, q / 2, 0.5, np.nan]), 0.5)[:2] == ["1", "0"]
    assert calibration.sets(np.array([np.nan]), 0.5) == [None]
    assert calibration.sets(np.array([0.5]), 0.5) == (["0,1"] if q >= 0.5 else [""])


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_json_round_trip_gives_the_same_numbers(tmp_path, method):
    p, y = _draw(300, seed=5)
    calibrations = {"active": fit_class_calibration("active", p, y, method)}
    path = tmp_path / "classification_calibration.json"
    save_class_calibrations(str(path), calibrations, source="fold_0 validation split")
    loaded = load_class_calibrations(str(path))
    assert loaded == calibrations
    assert run_class_calibration(tmp_path, ("active",)) == calibrations
    np.testing.assert_array_equal(loaded["active"].calibrated(p), calibrations["active"].calibrated(p))


def test_folds_pool_scores_and_average_platt(tmp_path):
    fits = []
    for k in range(2):
        (tmp_path / f"fold_{k}").mkdir()
        p, y = _draw(100 * (k + 1), seed=10 + k)
        fits.append(fit_class_calibration("active", p, y))
        save_class_calibrations(str(tmp_path / f"fold_{k}" / "classification_calibration.json"),
                                {"active": fits[-1]}, source=f"fold_{k}")
    pooled = run_class_calibration(tmp_path, ("active",))["active"]
    assert pooled.n == 300 and list(pooled.scores) == sorted(fits[0].scores + fits[1].scores)
    assert pooled.params[0][0] == pytest.approx((fits[0].params[0][0] + 2 * fits[1].params[0][0]) / 3)
    with pytest.raises(UserError, match=r"has no entry for task\(s\) \['other'\]"):
        run_class_calibration(tmp_path, ("other",))


@pytest.mark.parametrize("edit, key", [
    (lambda r: r.update(format="kermt-calibration"), "'format'"),
    (lambda r: r["tasks"]["active"].update(method="temperature"), "'tasks.active.method'"),
    (lambda r: r["tasks"]["active"].pop("b"), "'tasks.active.b'"),
    (lambda r: r["tasks"]["active"].update(scores=[0.5, 0.2]), "'tasks.active.scores'"),
    (lambda r: r["tasks"]["active"].update(scores=[1.5]), "'tasks.active.scores'"),
])
def test_bad_files_name_the_file_and_key(tmp_path, edit, key):
    path = tmp_path / "c.json"
    p, y = _draw(50, seed=6)
    save_class_calibrations(str(path), {"active": fit_class_calibration("active", p, y)}, source="test")
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(UserError, match=f"classification calibration file {path}: key {key}"):
        load_class_calibrations(str(path))


def test_isotonic_file_checks_its_thresholds(tmp_path):
    path = tmp_path / "c.json"
    p, y = _draw(200, seed=7)
    save_class_calibrations(str(path), {"t": fit_class_calibration("t", p, y, "isotonic")}, source="test")
    record = json.loads(path.read_text())
    record["tasks"]["t"]["y"] = record["tasks"]["t"]["y"][::-1]
    path.write_text(json.dumps(record))
    with pytest.raises(UserError, match="key 'tasks.t.y' must list one probability per x, non-decreasing"):
        load_class_calibrations(str(path))


def test_too_few_rows_or_one_class_is_a_one_line_error_naming_the_task():
    p, y = _draw(40, seed=8)
    y[19:] = np.nan  # 19 labelled
    with pytest.raises(UserError, match="val split: column 'active' has 19 labelled molecule.s.; a calibration "
                                        "needs at least 20") as error:
        fit_class_calibration("active", p, y, source="val split")
    assert "\n" not in str(error.value)
    with pytest.raises(UserError, match="column 'toxic': every labelled molecule is class 0"):
        fit_class_calibration("toxic", p, np.zeros(40))
    with pytest.raises(UserError, match="column 'toxic' has labels other than 0 and 1"):
        fit_class_calibration("toxic", p, np.full(40, 2.0))
    with pytest.raises(UserError, match="a labelled molecule has no probability in"):
        fit_class_calibration("toxic", np.full(40, np.nan), np.array([0.0, 1.0] * 20))


def test_an_ensembles_validation_predictions_give_every_tasks_calibration(tmp_path):
    rng = np.random.default_rng(9)
    p_a, y_a = _draw(400, seed=9, bias=0.5)
    p_b, y_b = _draw(400, seed=10)
    y_b[:100] = np.nan  # a sparse task: calibrated on its 300 labelled molecules
    members = np.clip(np.stack([p_a, p_b], axis=1)[None] + rng.normal(0, 0.01, size=(3, 400, 2)), 0, 1)
    labels = np.stack([y_a, y_b], axis=1)
    fitted = fit_class_calibrations(("a", "b"), members, labels, source="fold_0 validation split")
    assert [c.n for c in fitted.values()] == [400, 300]
    assert fitted["a"] == fit_class_calibration("a", members.mean(axis=0)[:, 0], y_a)
    record = class_calibration_record(fitted, members.mean(axis=0), labels)
    assert record["a"]["calibrated_ece"] < record["a"]["ece"] / 2 and 1 <= record["b"]["mean_set_size_0.9"] <= 2
    labels[:, 1] = np.where(np.isnan(labels[:, 1]), np.nan, 1.0)
    with pytest.raises(UserError, match="fold_0 validation split: column 'b': every labelled molecule is class 1"):
        fit_class_calibrations(("a", "b"), members, labels, source="fold_0 validation split")


def test_the_method_names_are_the_registrys_and_isotonic_equals_scikit_learns_fit():
    from sklearn.isotonic import IsotonicRegression

    from kermt.registry import CLASS_CALIBRATION_METHODS
    from kermt.uncertainty import CLASSIFICATION_METHODS

    assert CLASSIFICATION_METHODS == CLASS_CALIBRATION_METHODS == ("platt", "isotonic")
    p, y = _draw(500, seed=7)
    fitted = fit_class_calibration("active", p, y, "isotonic")
    reference = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(p, y)
    new = np.linspace(0.0, 1.0, 101)  # between and beyond the calibration probabilities
    np.testing.assert_allclose(fitted.calibrated(new), reference.predict(new), atol=1e-12)
