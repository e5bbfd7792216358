"""The ``kermt`` console script.

One subcommand per task. Each is a :class:`Command`: a name, a one-line help, a function that adds its arguments
to its sub-parser, and a function that runs it from the parsed Namespace (argparse stops here: the run function
converts the Namespace to typed config before calling library code). To add a subcommand (finetune, tune,
predict, fingerprint, embed, pretrain), write its two functions and append it to :data:`COMMANDS`.

Bad input is a :class:`kermt.errors.UserError`: printed as one line ``kermt <command>: error: <message>`` with exit
status 2 (argparse's own usage errors too); any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable, NoReturn, Sequence

from kermt import DISTRIBUTION, __version__
from kermt.errors import UserError, run_reporting_user_errors, user_input
from kermt.inputs import check_checkpoint_file
from kermt.registry import DATASET_TYPES


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is a :class:`UserError` (one line, exit 2) instead of usage text + exit."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see {self.prog} --help)")


def _add_trust_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust_checkpoint", action="store_true",
        help="fully unpickle upstream .pt files (can run code from the file; only for files you trust). "
             "By default only plain checkpoint data (tensors, args, numpy arrays) is loaded.",
    )


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="upstream .pt checkpoint or native checkpoint directory")
    _add_trust_flag(parser)
    parser.add_argument("--no_load_check", action="store_true",
                        help="skip rebuilding the model and loading the weights (finetuned checkpoints)")
    parser.add_argument("--dataset_type", choices=DATASET_TYPES,
                        help="only for an upstream finetuned checkpoint that stores neither its dataset type nor "
                             "target statistics (a checkpoint that stores it decides)")


def _run_inspect(args: argparse.Namespace) -> int:
    from kermt.checkpoint.inspect import inspect_checkpoint
    from kermt.checkpoint.reader import read_checkpoint

    check_checkpoint_file(args.path, "file")
    with user_input():  # everything here only reads the user's file
        checkpoint = read_checkpoint(args.path, trust_pickle=args.trust_checkpoint, dataset_type=args.dataset_type)
        report = inspect_checkpoint(checkpoint, load_check=not args.no_load_check)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


COMMANDS: list[Command] = [
    Command("inspect", "describe a checkpoint (kind, architecture, tasks, scalers, key groups) as JSON",
            _inspect_arguments, _run_inspect),
]


def build_parser(commands: Sequence[Command] = tuple(COMMANDS)) -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="kermt", description="KERMT molecular property prediction")
    parser.add_argument("--version", action="version", version=f"kermt {__version__} ({DISTRIBUTION})")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(_run=command.run)
    return parser


def prog_name(argv: Sequence[str], commands: Sequence[str]) -> str:
    """``kermt <command>`` as error lines name it (``kermt`` when no known command is given)."""
    return f"kermt {argv[0]}" if argv and argv[0] in commands else "kermt"


def run_parsed(argv: Sequence[str], commands: Sequence[Command]) -> int:
    """Parse ``argv`` against ``commands`` and run the chosen one; a user error is one line and exit status 2."""

    def run() -> int:
        args = build_parser(commands).parse_args(argv)
        return args._run(args)

    return run_reporting_user_errors(prog_name(argv, [c.name for c in commands]), run)


def main(argv: Sequence[str] | None = None) -> int:
    return run_parsed(list(sys.argv[1:] if argv is None else argv), COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
