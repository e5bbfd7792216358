"""DIR/report.html of `kermt explore`, rewritten after every round: the rounds' best and top-k found against random's
expectation, each batch's scores, and the last surrogate's parity on what was scored; opened in headless
Chromium (every figure decodes, no console error, the per-round table shows every round with its values)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kermt.explore.explored import read_explored
from ray_app.cli import main
from ray_app.report.build import write_report
from ray_app.report.explore import TOP_K
from tests.browser import console_errors, headless_chromium, keep_screenshot, rendered_images, requires_browser

DEMO = Path(__file__).resolve().parents[3] / "data" / "sample" / "admet_demo.csv"


@pytest.fixture(scope="module")
def random_run(tmp_path_factory) -> Path:
    save_dir = tmp_path_factory.mktemp("explore_report") / "run"
    assert main(["explore", "--library", str(DEMO), "--objective", f"lookup:{DEMO}:logp", "--init_size", "0.05",
                 "--acquire_size", "40", "--iterations", "3", "--acquisition", "random", "--seed", "2",
                 "--save_dir", str(save_dir)]) == 0
    return save_dir


def _table_rows(driver, caption: str) -> list[list[str]]:
    return driver.execute_script("""
        for (const table of document.querySelectorAll('table')) {
          const c = table.querySelector('caption');
          if (c && c.textContent.trim() === arguments[0]) {
            return [...table.querySelectorAll('tr')].slice(1).map(r => [...r.cells].map(x => x.textContent));
          }
        }
        return null;""", caption)


@requires_browser
def test_the_report_shows_every_round_against_random_in_chromium(random_run):
    explored = read_explored(str(random_run / "explored.csv"))
    with headless_chromium() as driver:
        driver.get((random_run / "report.html").as_uri())
        images = rendered_images(driver)
        assert console_errors(driver) == []
        rows = _table_rows(driver, "per round")
        headings = [h.text for h in driver.find_elements("css selector", "h2")]
        keep_screenshot(driver, "explore_report")
    assert len(images) == 2 and all(i["complete"] and i["natural"] > 0 for i in images)  # found; batches
    assert "Found per round against random" in headings and "Scores of each batch" in headings
    assert [r[0] for r in rows] == ["0", "1", "2", "3"] and [r[1] for r in rows] == ["100", "40", "40", "40"]
    for r, row in enumerate(rows):
        so_far = explored.score[explored.round <= r]
        so_far = np.sort(so_far[np.isfinite(so_far)])[::-1]
        assert float(row[4]) == pytest.approx(so_far[0], rel=1e-3)  # best so far
        assert float(row[5]) == pytest.approx(so_far[:TOP_K].mean(), rel=1e-3)
        assert float(row[6]) <= so_far[0] + 1e-9 or r == 0  # random's best is drawn from round 0's scores
    first = explored.score[(explored.round == 0) & np.isfinite(explored.score)]
    assert float(rows[0][6]) < first.max()  # 100 draws with replacement miss the best now and then


def test_the_last_surrogates_parity_is_shown(random_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(random_run, run)
    explored = read_explored(str(run / "explored.csv"))
    rows = 2000
    predicted = np.full(rows, np.nan)
    predicted[explored.library_row] = np.nan_to_num(explored.score, nan=0.0) + 0.5  # off by 0.5 everywhere
    (run / "round_3").mkdir(exist_ok=True)  # as a surrogate trained for round 3 would leave it
    pq.write_table(pa.table({"smiles": [""] * rows, "score": predicted, "score_std": np.zeros(rows)}),
                   run / "round_3" / "library_predictions.parquet")
    page = write_report(run).read_text()
    assert "The last surrogate (round 3) on what was scored" in page
    scored = np.isfinite(explored.score)
    for label, n in (("trained on (rounds before)", int((scored & (explored.round < 3)).sum())),
                     ("round 3&#39;s batch (chosen, then scored)", int((scored & (explored.round == 3)).sum()))):
        assert f"<td>{label}</td><td>{n}</td><td>1</td><td>0.5</td>" in page
