"""The first line of a run: where its outputs go and where its report will be, for directories, files and URIs."""

from __future__ import annotations

from ray_app.report import start_line


def test_the_first_line_names_the_outputs_and_the_report_to_come():
    assert start_line("runs/x", of_file=False) == \
        "outputs: runs/x (the report, runs/x/report.html, is written when the run ends)"
    assert start_line("preds.csv", of_file=True) == \
        "output: preds.csv (the report, preds_report.html, is written when the run ends)"
    assert start_line("s3://b/p/out.parquet?endpoint_override=h:9", of_file=True) == (
        "output: s3://b/p/out.parquet?endpoint_override=h:9 (the report, s3://b/p/out_report.html?endpoint_override=h:9,"
        " is written when the run ends)")
    assert start_line("s3://b/run/", of_file=False).startswith("outputs: s3://b/run/ (the report, s3://b/run/report.html,")
