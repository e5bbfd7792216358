"""Entry points of `kermt predict`, `eval`, `fingerprint`, `embed`, `reconstruct` (``ray_app.cli`` dispatches here).

Each runs ``ray_app.common.command.run_command``, then imports the runner (and so Ray) only once the flags are known
to be good.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from kermt.errors import run_reporting_user_errors
from kermt.run_layout import BESIDE_OUTPUT_SUFFIXES, REPORT_SUFFIX, beside_output
from ray_app.common.command import run_command
from ray_app.common.errors import ray_causes
from ray_app.common.remote_files import local_files, upload
from ray_app.common.storage import beside_uri, is_uri
from ray_app.screening.config import EmbedConfig, EvalConfig, FingerprintConfig, PredictConfig, ReconstructConfig


def _run(prog: str, schema: type[BaseModel], argv: list[str], body, reported: bool = False) -> int:
    """Run ``body`` on the settings ``argv`` resolves to; a user error (also one raised in a Ray task) is one line,
    exit 2. ``reported``: the body writes a report beside --output_path, which goes to a URI output's directory
    too."""

    def with_local_files(config: BaseModel, sources) -> int:
        # --checkpoint_path/--checkpoint_dir URIs are downloaded, an --output_path URI is uploaded once complete;
        # --data_path and --calibration_path are streamed by Ray Data itself, URI or not (on a cluster every node
        # reads them where they are).
        if reported:
            from ray_app.report.build import start_line  # the report's modules: not on the path of `--help`

            print(start_line(config.output_path, of_file=True), flush=True)
        with local_files(config, keep_remote=("data_path", "calibration_path")) as local:
            status = body(local)
            if reported:
                _say_where_the_report_is(Path(local.output_path), config.output_path)
            return status

    return run_reporting_user_errors(prog, lambda: run_command(prog, schema, argv, with_local_files), ray_causes)


def main_predict(argv: list[str]) -> int:
    return _run("kermt predict", PredictConfig, argv, _predict_and_report, reported=True)


def _predict_and_report(config: PredictConfig) -> int:
    """`kermt predict`, then ``<stem>_report.html`` from the file it wrote (streamed in bounded memory: a screen
    of millions of molecules costs seconds more); the model says its tasks and dataset type."""
    from ray_app.report.build import report_of_finished_run
    from ray_app.screening.run import run_predict

    status = run_predict(config)
    # the model colours the report's top molecules by attribution (computed for those few, in this process)
    report_of_finished_run(Path(config.output_path), *_model_tasks(config),
                           model=str(config.checkpoint_dir or config.checkpoint_path),
                           trust_checkpoint=config.trust_checkpoint)
    return status


def _model_tasks(config: PredictConfig) -> tuple[str | None, tuple[str, ...] | None]:
    """(dataset type, task names) of the first member (run_predict has read and checked them all); (None, None)
    when it cannot say, and the report reads them off the file."""
    from kermt.checkpoint import read_checkpoint
    from kermt.inference import find_checkpoints, task_names

    try:
        path = find_checkpoints(config.checkpoint_dir)[0] if config.checkpoint_dir else config.checkpoint_path
        spec = read_checkpoint(path, trust_pickle=config.trust_checkpoint, dataset_type=config.dataset_type).spec
        return spec.head.dataset_type, task_names(spec)
    except Exception:  # any: the report guesses instead; the predictions are written either way
        return None, None


def _runner(module: str, function: str) -> Callable[[BaseModel], int]:
    """A command's body, imported when it runs: `--help` and a settings error never import Ray or torch."""

    def body(config: BaseModel) -> int:
        return getattr(importlib.import_module(module), function)(config)

    return body


def main_eval(argv: list[str]) -> int:
    return _run("kermt eval", EvalConfig, argv, _runner("ray_app.screening.scoring", "run_eval"), reported=True)


def _say_where_the_report_is(output: Path, shown: str) -> None:
    """One line naming the report; for a URI --output_path, the files written beside the output (the report, the
    interval and domain scores, eval's attributions) are uploaded beside it first: only the output file itself is
    staged for upload by local_files."""
    if is_uri(shown):
        for suffix in BESIDE_OUTPUT_SUFFIXES:
            written = beside_output(output, suffix)
            if written.exists():
                upload(written, beside_uri(shown, suffix), "--output_path")
    report = beside_output(output, REPORT_SUFFIX)
    if report.exists():  # else not written (the run printed why)
        print(f"report: {beside_uri(shown, REPORT_SUFFIX) if is_uri(shown) else report}", flush=True)


def main_fingerprint(argv: list[str]) -> int:
    return _run("kermt fingerprint", FingerprintConfig, argv, _runner("ray_app.screening.run", "run_fingerprint"))


def main_embed(argv: list[str]) -> int:
    return _run("kermt embed", EmbedConfig, argv, _runner("ray_app.screening.run", "run_embed"))


def main_reconstruct(argv: list[str]) -> int:
    return _run("kermt reconstruct", ReconstructConfig, argv,
                _runner("ray_app.screening.reconstruct", "run_reconstruct"))


__all__ = ["main_embed", "main_eval", "main_fingerprint", "main_predict", "main_reconstruct"]
