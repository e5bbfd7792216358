"""The reports of real tiny finetunes opened in headless Chromium from file://: every figure and molecule drawing
decodes (naturalWidth > 0), nothing is logged as an error, and a screenshot is kept under test-artifacts/."""

from __future__ import annotations

import pytest

from ray_app.report.build import REPORT_FILE
from tests.browser import console_errors, headless_chromium, keep_screenshot, rendered_images, requires_browser

pytestmark = requires_browser
IMAGES = 1 + 2 * (2 + 1 + 8)  # learning curves; per task two figures, the colour key and the 8 worst molecules


@pytest.mark.parametrize("run, name", [
    ("regression_run", "finetune_report"),
    pytest.param("classification_run", "finetune_report_classification", marks=pytest.mark.slow)])
def test_finetune_report_renders_every_figure(run, name, request):
    save_dir, _ = request.getfixturevalue(run)
    with headless_chromium() as driver:
        driver.get((save_dir / REPORT_FILE).as_uri())
        images = rendered_images(driver)
        assert console_errors(driver) == []
        screenshot = keep_screenshot(driver, name)
    assert len(images) == IMAGES
    assert all(i["kind"] == "img" and i["complete"] and i["natural"] > 0 and i["width"] > 0 for i in images)
    assert screenshot.stat().st_size > 50_000
