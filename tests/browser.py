"""A real headless browser for the tests of pages and reports: Debian's ``chromium`` driven through its
``chromedriver`` (both installed by ``.ci/run``), never a browser that a library downloads.

``open_page`` loads a URL (``http://`` or ``file://``), waits for the page to settle, and hands back the driver;
``console_errors`` lists what the page logged at level SEVERE; ``keep_screenshot`` saves a PNG under
``test-artifacts/`` (or ``$KERMT_TEST_ARTIFACTS``) so a person can look at what the test saw.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ARTIFACTS_DIR = Path(os.environ.get("KERMT_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

requires_browser = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run does)")


@contextmanager
def headless_chromium(width: int = 1400, height: int = 1000) -> Iterator["object"]:
    """A headless Chromium session; the browser log is kept so that console errors can be asserted on."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={width},{height}", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    """Messages the page logged at SEVERE level (JavaScript errors, failed resource loads) since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def keep_screenshot(driver, name: str) -> Path:
    """Save the full page as ``<artifacts>/<name>.png`` and return the path."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS_DIR / f"{name}.png"
    # the window's outer size includes the browser's own chrome: add it, so the viewport holds the whole page
    height, chrome = driver.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]")
    driver.set_window_size(1400, max(1000, min(int(height) + max(0, int(chrome)), 12000)))
    driver.save_screenshot(str(path))
    return path


def rendered_images(driver) -> list[dict]:
    """Every <img> and inline <svg> on the page with its rendered size (an image that failed to decode has
    naturalWidth 0)."""
    return driver.execute_script("""
        const out = [];
        for (const img of document.images) {
          out.push({kind: 'img', complete: img.complete, natural: img.naturalWidth,
                    width: img.getBoundingClientRect().width, height: img.getBoundingClientRect().height,
                    alt: img.alt || ''});
        }
        for (const svg of document.querySelectorAll('svg')) {
          if (svg.parentElement && svg.parentElement.closest('svg')) continue;
          const r = svg.getBoundingClientRect();
          out.push({kind: 'svg', complete: true, natural: r.width, width: r.width, height: r.height,
                    alt: svg.getAttribute('aria-label') || ''});
        }
        return out;""")
