"""`kermt report PATH` through the console script's entry point."""

from __future__ import annotations

import shutil

from ray_app.cli import main


def test_kermt_report_rebuilds_the_page_from_the_files(regression_run, tmp_path, capsys):
    run = shutil.copytree(regression_run[0], tmp_path / "run", ignore=shutil.ignore_patterns("ray_results"))
    (run / "report.html").unlink()
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out == f"report: {run / 'report.html'}\n"
    assert "Task tpsa_100" in (run / "report.html").read_text()


def test_kermt_report_says_what_it_needs(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist: give a finetune --save_dir" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "neither a finetune, tune nor pretrain --save_dir" in capsys.readouterr().err
    assert main(["report", "s3://bucket/run"]) == 2
    assert "copy the run down first" in capsys.readouterr().err


def test_kermt_report_refuses_a_folder_it_cannot_write_in_before_reading(capsys):
    """The report goes beside the file it reports on; /proc takes no new file, root's neither."""
    assert main(["report", "/proc/self/status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kermt report: error: report /proc/self/status_report.html: cannot write in /proc/self (")
    assert err.endswith("); the report goes beside what it reports on: copy that to a folder you can write to\n")
