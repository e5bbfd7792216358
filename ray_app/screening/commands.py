"""Entry points of `kermt predict`, `eval`, `fingerprint`, `embed`, `reconstruct` (``ray_app.cli`` dispatches here).

Each runs ``ray_app.common.command.run_command``, then imports the runner (and so Ray) only once the flags are known
to be good.
"""

from __future__ import annotations

from pydantic import BaseModel

from kermt.errors import run_reporting_user_errors
from ray_app.common.command import run_command
from ray_app.common.errors import ray_causes
from ray_app.common.remote_files import local_files
from ray_app.screening.config import EmbedConfig, EvalConfig, FingerprintConfig, PredictConfig, ReconstructConfig


def _run(prog: str, schema: type[BaseModel], argv: list[str], body) -> int:
    """Run ``body`` on the settings ``argv`` resolves to; a user error (also one raised in a Ray task) is one line,
    exit 2."""

    def with_local_files(config: BaseModel, sources) -> int:
        # --checkpoint_path/--checkpoint_dir URIs are downloaded, an --output_path URI is uploaded once complete;
        # --data_path is streamed by Ray Data itself, URI or not.
        with local_files(config, keep_remote=("data_path",)) as local:
            return body(local)

    return run_reporting_user_errors(prog, lambda: run_command(prog, schema, argv, with_local_files), ray_causes)


def main_predict(argv: list[str]) -> int:
    from ray_app.screening.run import run_predict

    return _run("kermt predict", PredictConfig, argv, run_predict)


def main_eval(argv: list[str]) -> int:
    from ray_app.screening.scoring import run_eval

    return _run("kermt eval", EvalConfig, argv, run_eval)


def main_fingerprint(argv: list[str]) -> int:
    from ray_app.screening.run import run_fingerprint

    return _run("kermt fingerprint", FingerprintConfig, argv, run_fingerprint)


def main_embed(argv: list[str]) -> int:
    from ray_app.screening.run import run_embed

    return _run("kermt embed", EmbedConfig, argv, run_embed)


def main_reconstruct(argv: list[str]) -> int:
    from ray_app.screening.reconstruct import run_reconstruct

    return _run("kermt reconstruct", ReconstructConfig, argv, run_reconstruct)


__all__ = ["main_embed", "main_eval", "main_fingerprint", "main_predict", "main_reconstruct"]
