"""The ``kermt`` console script: the library's subcommands (``kermt.cli``) plus the Ray ones defined here.

Ray subcommands own their whole argument list (their flags are generated from the typed run config), so they are
dispatched before the top-level parser; they are still listed in ``kermt --help``.

Errors: a :class:`kermt.errors.UserError`, also one raised inside a Ray task, actor or training worker (Ray wraps
those; :func:`ray_causes` unwraps them), is printed as one line ``kermt <command>: error: <message>`` with exit
status 2. Anything else is a bug and keeps its traceback. The ``jobs/`` entry points call :func:`main`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from kermt import cli as library_cli
from kermt.errors import run_reporting_user_errors
from ray_app.common.errors import ray_causes


def _lazy(module: str, function: str) -> Callable[[list[str]], int]:
    """A subcommand whose module (and so Ray) is imported only when it runs."""

    def run(argv: list[str]) -> int:
        return getattr(importlib.import_module(module), function)(argv)

    return run


RAY_COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "finetune": ("finetune on a Ray cluster (upstream main.py finetune flags + --num_workers/--use_gpu)",
                 _lazy("ray_app.finetune.command", "main")),
    "tune": ("hyperparameter search: finetune trials in parallel with Ray Tune (Optuna, ASHA)",
             _lazy("ray_app.tune.command", "main")),
    "predict": ("streaming predictions with Ray Data (upstream main.py predict flags)",
                _lazy("ray_app.screening.commands", "main_predict")),
    "eval": ("score a model or ensemble on a labelled file (upstream main.py eval; metrics, test_result.csv)",
             _lazy("ray_app.screening.commands", "main_eval")),
    "fingerprint": ("molecule fingerprints from a checkpoint (upstream main.py fingerprint flags)",
                    _lazy("ray_app.screening.commands", "main_fingerprint")),
    "embed": ("readout embeddings (and cmim/hybrid latents) as Parquet or .npy",
              _lazy("ray_app.screening.commands", "main_embed")),
    "reconstruct": ("SMILES generated from cmim/hybrid latents (upstream task/reconstruct.py), streamed with Ray Data",
                    _lazy("ray_app.screening.commands", "main_reconstruct")),
    "corpus": ("prepare a pretraining corpus with Ray Data: vocabs, labels, graph shards (kermt pretrain reads it)",
               _lazy("ray_app.pretrain.commands", "main_corpus")),
    "pretrain": ("vocab / cmim / hybrid pretraining on Ray Train from a corpus (upstream pretrain_ddp.py flags)",
                 _lazy("ray_app.pretrain.commands", "main_pretrain")),
    "explore": ("model-guided search of a library: train a surrogate, acquire the next batch, score it, per round",
                _lazy("ray_app.explore.command", "main")),
    "report": ("rebuild a run's report.html (figures, metrics, worst molecules) from its save_dir or scored file",
               _lazy("ray_app.report.command", "main")),
    "serve": ("trained models as an HTTP service on Ray Serve (POST /predict, GET /models; batched replicas)",
              _lazy("ray_app.serve.command", "main")),
}


def _listed(name: str, help_text: str) -> library_cli.Command:
    return library_cli.Command(name, help_text, lambda parser: None, lambda args: 0)


def _fetched_inspect_path(argv: list[str]) -> list[str]:
    """``kermt inspect URI``: the library command reads local files, so a URI (s3://, hf://...) is fetched first."""
    from ray_app.common.remote_files import fetch_input
    from ray_app.common.storage import is_uri

    return [fetch_input(a, "checkpoint") if i and is_uri(a) else a for i, a in enumerate(argv)]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["inspect"] and any("://" in a for a in argv[1:]):
        local: list[str] = []
        failed = run_reporting_user_errors("kermt inspect", lambda: local.extend(_fetched_inspect_path(argv)) or 0)
        if failed:
            return failed
        argv = local
    if argv and argv[0] in RAY_COMMANDS:
        command = RAY_COMMANDS[argv[0]][1]
        return run_reporting_user_errors(f"kermt {argv[0]}", lambda: command(argv[1:]), ray_causes)
    commands = list(library_cli.COMMANDS) + [_listed(n, h) for n, (h, _) in RAY_COMMANDS.items()]
    return library_cli.run_parsed(argv, commands)


if __name__ == "__main__":
    sys.exit(main())
