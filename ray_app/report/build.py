"""Which report a path gets, and where it is written: a finetune, tune or pretrain save_dir gets
``save_dir/report.html``; a file `kermt eval` scored (upstream's test_result.csv layout) or `kermt predict` wrote
(its valid/error columns) gets ``<stem>_report.html`` beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kermt.data import atomic_files
from kermt.errors import UserError, first_line
from kermt.run_layout import REPORT_FILE, REPORT_SUFFIX, RUN_STATE_FILE, SWEEP_FILE, RunLayout, fold_name
from ray_app.common.storage import beside_uri
from ray_app.report.page import write_page

def report_path(path: Path) -> Path:
    """Where the report of ``path`` (a run's directory, or a scored file) goes."""
    return Path(report_uri(str(path), of_file=not path.is_dir()))


def write_report(path: Path | str, dataset_type: str | None = None, tasks: Sequence[str] | None = None, *,
                 model: str | None = None, trust_checkpoint: bool = False) -> Path:
    """Build the report of ``path`` from its files and write it; returns where it is. ``dataset_type`` (and, for a
    `kermt predict` output, ``tasks``): what a file holds, when the caller knows (else it is read off the file).
    ``model``: for a file, the model that wrote it (a run's directory or a checkpoint), which colours the drawn
    molecules by attribution (a finetune's own folds do that for its report)."""
    path = Path(path)
    if path.is_file():
        from ray_app.report.library import is_prediction_output

        if is_prediction_output(path):
            from ray_app.report.predict import predict_report

            return write_page(predict_report(path, dataset_type, tasks, model, trust_checkpoint), report_path(path))
        from ray_app.report.evaluation import eval_report

        return write_page(eval_report(path, dataset_type, model, trust_checkpoint), report_path(path))
    if not path.is_dir():
        raise UserError(f"{path} does not exist: give a finetune --save_dir or a file kermt eval wrote")
    if RunLayout(path).explore_settings.exists():
        from ray_app.report.explore import explore_report

        return write_page(explore_report(path), report_path(path))
    if RunLayout(path).sweep.exists() or RunLayout(path).all_trials.exists():
        from ray_app.report.tune import tune_report

        return write_page(tune_report(path), report_path(path))
    from ray_app.report.pretrain import is_pretrain_dir  # before a finetune's: pretraining writes run_state.json too

    if is_pretrain_dir(path):
        from ray_app.report.pretrain import pretrain_report

        return write_page(pretrain_report(path), report_path(path))
    if RunLayout(path).run_state.exists() or RunLayout(path).folds():
        from ray_app.report.finetune import finetune_report

        return write_page(finetune_report(path), report_path(path))
    raise UserError(f"{path}: neither a finetune, tune nor pretrain --save_dir (no {RUN_STATE_FILE}, "
                    f"{fold_name(0)}/ or {SWEEP_FILE}) nor a scored file; give the directory kermt finetune, tune or "
                    "pretrain wrote, or the --output_path of kermt eval or kermt predict")


def start_line(shown: str, of_file: bool) -> str:
    """The line a run prints first: where its outputs go and where its report will be (``shown``: --save_dir, or
    --output_path with ``of_file``, as the user gave it, local or URI)."""
    report = report_uri(shown, of_file)
    return f"{'output' if of_file else 'outputs'}: {shown} (the report, {report}, is written when the run ends)"


def report_uri(shown: str, of_file: bool) -> str:
    """Where the report of the run at ``shown`` (a URI, its query kept last, or a local path) lands: a directory's
    report.html, or ``<stem>_report.html`` beside a file. The one naming rule of every report."""
    return beside_uri(shown, REPORT_SUFFIX) if of_file else atomic_files.join(shown, REPORT_FILE)


def report_of_finished_run(local: Path, dataset_type: str | None = None, tasks: Sequence[str] | None = None, *,
                           model: str | None = None, trust_checkpoint: bool = False) -> Path | None:
    """Write the report of a run that just ended (or was stopped). A report that cannot be built is a one-line
    note, never the run's failure: its models and files are what matters, and ``kermt report`` rebuilds it.
    ``model``, ``trust_checkpoint``: as :func:`write_report`'s."""
    try:
        return write_report(local, dataset_type, tasks, model=model, trust_checkpoint=trust_checkpoint)
    except Exception as error:  # any: a bug in a figure must not fail a finished run
        print(f"report: not written ({type(error).__name__}: {first_line(error)}); `kermt report {local}` retries",
              flush=True)
        return None


def announce_report(local: Path, shown: str, dataset_type: str | None = None) -> Path | None:
    """:func:`report_of_finished_run`, and one line saying where the report is: ``shown`` is the run's own
    --save_dir (a URI: the report goes up with the run's other files when the command ends)."""
    path = report_of_finished_run(local, dataset_type)
    if path is not None:
        print(f"report: {report_uri(shown, local.is_file()) if '://' in shown else path}", flush=True)
    return path


__all__ = ["REPORT_FILE", "announce_report", "report_of_finished_run", "report_path", "report_uri", "write_report"]
