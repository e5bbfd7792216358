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
