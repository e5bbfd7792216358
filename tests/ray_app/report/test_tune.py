"""The report of a real tiny `kermt tune` sweep (the session's 2 trials of 2 epochs on 80 molecules that
tests/ray_app/tune reads too: tests/ray_app/tune/sweeps.py), written at the end of the sweep and opened in headless
Chromium."""

from __future__ import annotations

import csv

import pytest

from ray_app.report.build import REPORT_FILE
from ray_app.report.tune import tune_report
from tests.browser import console_errors, headless_chromium, keep_screenshot, rendered_images, requires_browser
from tests.ray_app.tune.sweeps import SHARED_TRIALS

FIXED = 6  # trial_id, status, objective, test metric, best_epoch, epochs_run (then the settings, then error)


@pytest.fixture
def sweep(tune_sweep):
    return tune_sweep.save_dir, tune_sweep.out


def _varying(save_dir) -> list[str]:
    with open(save_dir / "all_trials.csv") as f:
        header, *rows = list(csv.reader(f))
    return [name for i, name in enumerate(header[FIXED:-1], FIXED) if len({r[i] for r in rows}) > 1]


def test_sweep_report_shows_objectives_settings_curves_and_trials(sweep):
    save_dir, out = sweep
    assert f"report: {save_dir / REPORT_FILE}" in out.splitlines()
    report = tune_report(save_dir)
    assert [s.title for s in report.sections] == ["Sweep", "Objective", "Learning curves", "Trials"]
    varying = _varying(save_dir)
    assert "max_lr" in varying
    assert [f.caption.split(" against ")[-1] for f in report.sections[1].figures[1:]] == varying
    assert len(report.sections[2].figures) == 2  # the best trial's curves, every trial's validation metric
    assert len(report.sections[3].tables[0].rows) == SHARED_TRIALS


@requires_browser
def test_sweep_report_renders_every_figure(sweep):
    save_dir, _ = sweep
    with headless_chromium() as driver:
        driver.get((save_dir / REPORT_FILE).as_uri())
        images = rendered_images(driver)
        assert console_errors(driver) == []
        keep_screenshot(driver, "tune_report")
    assert len(images) == 1 + len(_varying(save_dir)) + 2
    assert all(i["kind"] == "img" and i["natural"] > 0 for i in images)
