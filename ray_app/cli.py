"""The ``kermt`` console script: the library's subcommands (``kermt.cli``) plus the Ray ones defined here.

Ray subcommands own their whole argument list (their flags are generated from the typed run config), so they are
dispatched before the top-level parser; they are still listed in ``kermt --help``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from kermt import cli as library_cli


def _finetune(argv: list[str]) -> int:
    from ray_app.config import build_parser, resolve

    if any(a in ("-h", "--help") for a in argv):
        build_parser().print_help()
        return 0
    try:
        config, sources = resolve(argv)
    except ValueError as error:
        print(f"kermt finetune: error: {error}", file=sys.stderr)
        return 2
    from ray_app.finetune import run_finetune

    run_finetune(config, sources)
    return 0


def _lazy(module: str, function: str) -> Callable[[list[str]], int]:
    """A subcommand whose module (and so Ray) is imported only when it runs."""

    def run(argv: list[str]) -> int:
        return getattr(importlib.import_module(module), function)(argv)

    return run


RAY_COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "finetune": ("finetune on a Ray cluster (upstream main.py finetune flags + --num_workers/--use_gpu)", _finetune),
    "tune": ("hyperparameter search: finetune trials in parallel with Ray Tune (Optuna, ASHA)",
             _lazy("ray_app.tune", "main")),
    "predict": ("streaming predictions with Ray Data (upstream main.py predict flags)",
                _lazy("ray_app.predict", "main_predict")),
    "fingerprint": ("molecule fingerprints from a checkpoint (upstream main.py fingerprint flags)",
                    _lazy("ray_app.predict", "main_fingerprint")),
    "embed": ("readout embeddings (and cmim/hybrid latents) as Parquet or .npy",
              _lazy("ray_app.predict", "main_embed")),
}


def _listed(name: str, help_text: str) -> library_cli.Command:
    return library_cli.Command(name, help_text, lambda parser: None, lambda args: 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in RAY_COMMANDS:
        return RAY_COMMANDS[argv[0]][1](argv[1:])
    commands = list(library_cli.COMMANDS) + [_listed(n, h) for n, (h, _) in RAY_COMMANDS.items()]
    args = library_cli.build_parser(commands).parse_args(argv)
    try:
        return args._run(args)
    except library_cli.CommandError as error:
        print(f"kermt {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
