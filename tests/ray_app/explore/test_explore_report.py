"""DIR/report.html of `kermt explore`, rewritten after every round: the rounds' best and top-k found against random's
expectation, each batch's scores, and the last surrogate's parity on what was scored; opened in headless
Chromium (every figure decodes, no console error, the per-round table shows every round with its values). A lookup
objective knows every library score, so random's expectations are exact: checked here against scipy's
hypergeometric mean and a sum over every rank written out with exact binomial coefficients."""

from __future__ import annotations

import math
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.stats import hypergeom

from kermt.explore.explored import read_explored
from kermt.run_layout import RunLayout
from ray_app.cli import main
from ray_app.report.build import write_report
from ray_app.report.explore import TOP_K, explore_report, library_scores
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
    assert rows == explore_report(random_run).sections[0].tables[1].rows  # the page shows the table checked below


def test_a_lookups_random_expectations_are_exact(random_run):
    explored = read_explored(str(random_run / "explored.csv"))
    rows = explore_report(random_run).sections[0].tables[1].rows
    library = pd.read_csv(DEMO)["logp"].to_numpy()  # the lookup's scores of every library row (NaN: none)
    assert len(pd.read_csv(DEMO)["smiles"].unique()) == len(library)  # so the lookup gives each row its own
    np.testing.assert_array_equal(np.load(random_run / "library_lookup_scores.npy"), library)  # what the report read
    ranked = np.sort(library[np.isfinite(library)])[::-1]
    top = set(np.argsort(np.nan_to_num(-library, nan=np.inf), kind="stable")[:math.ceil(0.01 * len(ranked))])
    assert len(top) == 16  # 1,584 scored rows of 2,000
    for r, row in enumerate(rows):
        picked = int((explored.round <= r).sum())
        assert float(row[6]) == pytest.approx(_expected_best(ranked, len(library), picked), rel=1e-3)
        found = len(top & set(explored.library_row[explored.round <= r].tolist())) / len(top)
        assert float(row[8]) == pytest.approx(found, rel=1e-3)
        assert float(row[9]) == pytest.approx(hypergeom(len(library), len(top), picked).mean() / len(top), rel=1e-3)

def _expected_best(ranked: np.ndarray, rows: int, picked: int) -> float:
    """E[best of ``picked`` rows drawn from ``rows``], ``ranked`` the scores best first: rank i (1-based) is the
    best of a pick that holds it and none of the i - 1 above it, C(rows - i, picked - 1) of the C(rows, picked)."""
    chances = [Fraction(math.comb(rows - i, picked - 1), math.comb(rows, picked)) for i in range(1, len(ranked) + 1)]
    return float(sum(c * Fraction(float(s)) for c, s in zip(chances, ranked)) / sum(chances))


def test_without_a_lookup_random_is_estimated_from_round_0(random_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(random_run, run)
    settings = run / "explore_config.yaml"
    settings.write_text(settings.read_text().replace(f"lookup:{DEMO}:logp", "python:my_scores:logp"))
    assert (run / "library_lookup_scores.npy").is_file()  # the lookup run wrote them; a python objective ignores them
    assert library_scores(RunLayout(run), {"objective": "python:my_scores:logp", "library": str(DEMO)}) is None
    summary = explore_report(run).sections[0].tables[1]
    assert len(summary.columns) == 8 and "true top" not in " ".join(summary.columns)
    first = read_explored(str(run / "explored.csv"))
    first = first.score[(first.round == 0) & np.isfinite(first.score)]
    assert max(float(row[6]) for row in summary.rows) <= first.max() + 1e-9  # drawn from round 0's scores


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
