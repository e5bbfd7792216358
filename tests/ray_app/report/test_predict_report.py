"""The report of a real `kermt predict` run (the 2-member calibrated regression model of conftest.py, 300 demo
molecules and 3 invalid rows, with std, interval and applicability-domain columns): written beside the output,
opened in headless Chromium; `kermt report FILE` tells it from an eval output; and a 200,000-row output in the
same format is reported in bounded memory (the figures printed)."""

from __future__ import annotations

import contextlib
import csv
import io
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from ray_app.cli import main
from ray_app.report.library import library_stats
from tests.ray_app.screening.engines import main_predict
from tests.browser import console_errors, headless_chromium, keep_screenshot, rendered_images, requires_browser
from tests.ray_app.finetune.tiny_runs import demo_rows

INVALID = ["not_a_smiles", "", "C1CC"]
TASKS = ("logp", "tpsa_100")


@pytest.fixture(scope="module")
def predicted(regression_run, tmp_path_factory) -> tuple[Path, str]:
    """(the output file, what predict printed)."""
    base = tmp_path_factory.mktemp("predict_report")
    with open(base / "library.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["compound", "smiles"])
        smiles = [row[0] for row in demo_rows(300)[1:]]
        for i, s in enumerate(smiles[:150] + INVALID + smiles[150:]):
            writer.writerow([f"cpd-{i:04d}", s])
    out = base / "screen.csv"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main_predict(["--data_path", str(base / "library.csv"), "--output_path", str(out),
                             "--checkpoint_dir", str(regression_run[0]), "--uncertainty", "--interval", "0.9",
                             "--applicability_domain", "--smiles_column", "smiles", "--batch_size", "64"]) == 0
    return out, printed.getvalue()


def test_predict_writes_its_report_beside_the_output(predicted):
    out, printed = predicted
    report = out.with_name("screen_report.html")
    assert f"report: {report}" in printed
    page = report.read_text()
    for shown in ("Task logp", "Task tpsa_100", "The 12 molecules with the highest predicted logp",
                  "<td>unparsable</td><td>2</td>", "<td>empty</td><td>1</td>", "mean interval width",
                  "in the applicability domain:", "dataset type</td><td>regression<"):
        assert shown in page, shown
    stats = library_stats(out)  # read off the file alone, as `kermt report` does: the same tasks
    assert stats.layout.tasks == TASKS and stats.rows == 303 and stats.valid == 300
    assert sum(stats.reasons.values()) == 3
    assert set(stats.layout.std) == set(stats.layout.lower) == set(TASKS)
    assert [int(c.sum()) for _, c in (stats.histograms[t] for t in TASKS)] == [300, 300]
    top = [row["logp"] for row in stats.top_rows("logp")]
    assert len(top) == 12 and top == sorted(top, reverse=True) and top[0] == stats.moments["logp"].high


@requires_browser
def test_predict_report_renders_every_figure(predicted):
    report = predicted[0].with_name("screen_report.html")
    with headless_chromium() as driver:
        driver.get(report.as_uri())
        images = rendered_images(driver)
        assert console_errors(driver) == []
        screenshot = keep_screenshot(driver, "predict_report")
    assert len(images) == 1 + 2 * (1 + 1 + 12)  # domain distances; per task its histogram, colour key, 12 molecules
    assert all(i["kind"] == "img" and i["complete"] and i["natural"] > 0 and i["width"] > 0 for i in images)
    assert screenshot.stat().st_size > 50_000


def test_kermt_report_tells_a_predict_output_from_an_eval_output(predicted, regression_run, tmp_path, capsys):
    copy = tmp_path / "copy.csv"
    copy.write_bytes(predicted[0].read_bytes())
    assert main(["report", str(copy)]) == 0
    assert "kermt predict report: copy.csv" in (tmp_path / "copy_report.html").read_text()
    _large_output(predicted[0], tmp_path / "same.parquet", 303, parquet=True)  # the same rows as Parquet
    assert main(["report", str(tmp_path / "same.parquet")]) == 0
    parquet, text = library_stats(tmp_path / "same.parquet"), library_stats(predicted[0])
    assert (parquet.layout, parquet.rows, parquet.valid, parquet.reasons) == (text.layout, 303, 300, text.reasons)
    assert parquet.top_rows("logp") == text.top_rows("logp")
    scored = tmp_path / "scored.csv"  # upstream's test_result.csv layout, as kermt eval writes
    scored.write_bytes((regression_run[0] / "fold_0" / "test_result.csv").read_bytes())
    assert main(["report", str(scored)]) == 0
    assert "kermt eval report: scored.csv" in (tmp_path / "scored_report.html").read_text()


def _large_output(predicted: Path, path: Path, rows: int, parquet: bool = False) -> int:
    """The real predictions repeated to ``rows`` rows, written by pyarrow's CSV (or Parquet) writer as kermt predict
    writes them; returns how many are valid."""
    table = pa_csv.read_csv(predicted, convert_options=pa_csv.ConvertOptions(
        column_types={"error": pa.string(), "compound": pa.string()}))
    repeated = pa.concat_tables([table] * (rows // table.num_rows + 1)).slice(0, rows)
    if parquet:
        pq.write_table(repeated, path)
    else:
        pa_csv.write_csv(repeated, path, write_options=pa_csv.WriteOptions(quoting_style="needed"))
    return int(pc.sum(repeated.column("valid")).as_py())


# the report in a process of its own: its peak memory (VmHWM: ru_maxrss would count the forking pytest process)
# once its modules are imported, and after the report
REPORT_AND_PEAK = ("import re, sys, time; import ray_app.report.predict; from ray_app.cli import main; "
                   "peak = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]) // 1024; "
                   "base = peak(); t = time.perf_counter(); main(['report', sys.argv[1]]); "
                   "print(base, peak(), time.perf_counter() - t)")


def test_the_report_of_a_200k_row_output_streams_in_bounded_memory(predicted, tmp_path):
    """`kermt report` of a 200,000-row CSV output (47 MB): its time and the memory it adds are printed (measured
    here: 0.3-0.65 s and +91-110 MB at 200,000 rows, 2.9 s and +88 MB at 2,000,000: bounded); the page counts every
    row."""
    large = tmp_path / "large.csv"
    valid = _large_output(predicted[0], large, 200_000)
    done = subprocess.run([sys.executable, "-c", REPORT_AND_PEAK, str(large)], check=True, capture_output=True,
                          text=True)
    base_mb, peak_mb, seconds = (float(v) for v in done.stdout.split()[-3:])
    page = large.with_name("large_report.html")
    print(f"\nreport of 200,000 rows ({large.stat().st_size / 1e6:.0f} MB CSV): {seconds:.2f} s, peak RSS "
          f"{peak_mb:.0f} MB ({base_mb:.0f} MB once imported: +{peak_mb - base_mb:.0f} MB), page "
          f"{page.stat().st_size / 1e6:.2f} MB")
    text = page.read_text()
    assert f"<td>valid molecules</td><td>{valid}</td>" in text and "<td>rows</td><td>200000</td>" in text


def test_a_classifiers_calibrated_and_set_columns_are_not_taken_for_tasks(tmp_path):
    """Without the run, the tasks are read off the header: a calibrated classifier's output (`kermt predict
    --interval` on a run with classification_calibration.json) has c1, c2, then their _calibrated and _set."""
    from ray_app.report.library import output_layout

    path = tmp_path / "out.csv"
    path.write_text("smiles,c1,c2,c1_calibrated,c2_calibrated,c1_set,c2_set,valid,error\n"
                    "CCO,0.2,0.7,0.25,0.66,0,\"0,1\",True,\n"
                    "not_a_smiles,,,,,,,False,unparsable\n")
    assert output_layout(path).tasks == ("c1", "c2")
