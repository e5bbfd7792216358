"""Which report a path gets, and where it is written: a finetune save_dir gets ``save_dir/report.html``; a file
`kermt eval` scored (upstream's test_result.csv layout) gets ``<stem>_report.html`` beside it."""

from __future__ import annotations

from pathlib import Path

from kermt.errors import UserError
from kermt.run_layout import RUN_STATE_FILE
from ray_app.report.page import write_page
from ray_app.report.run_files import numbered

REPORT_FILE = "report.html"


def report_path(path: Path) -> Path:
    """Where the report of ``path`` (a run's directory, or a scored file) goes."""
    return path / REPORT_FILE if path.is_dir() else path.with_name(f"{path.stem}_report.html")


def write_report(path: Path | str) -> Path:
    """Build the report of ``path`` from its files and write it; returns where it is."""
    path = Path(path)
    if path.is_file():
        from ray_app.report.evaluation import eval_report

        return write_page(eval_report(path), report_path(path))
    if not path.is_dir():
        raise UserError(f"{path} does not exist: give a finetune --save_dir or a file kermt eval wrote")
    if (path / RUN_STATE_FILE).exists() or numbered(path, "fold"):
        from ray_app.report.finetune import finetune_report

        return write_page(finetune_report(path), report_path(path))
    raise UserError(f"{path}: neither a finetune --save_dir (no {RUN_STATE_FILE}, no fold_0/) nor a scored file; "
                    "give the directory kermt finetune wrote, or the --output_path of kermt eval")


__all__ = ["REPORT_FILE", "report_path", "write_report"]
