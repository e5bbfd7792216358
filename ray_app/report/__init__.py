"""``report.html``: what a run's files say, as one self-contained page (figures and molecules inline, no network).

A thin layer over the files a run already writes: ``write_report`` rebuilds the page from them at any time
(``kermt report DIR``), also for runs made before the report existed. It reads files only (no Ray).
"""

from ray_app.report.build import (REPORT_FILE, announce_report, report_of_finished_run, report_path, start_line,
                                  write_report)

__all__ = ["REPORT_FILE", "announce_report", "report_of_finished_run", "report_path", "start_line", "write_report"]
