"""The CLI reference (docs/cli.md), rendered from the argument parsers the ``kermt`` subcommands build.

One source of truth: the page is made from the very parsers that ``kermt <command> --help`` prints, so a new
subcommand (in ``kermt.cli.COMMANDS`` or ``ray_app.cli.RAY_COMMANDS``) or a new flag appears in it on the next
render. Ray subcommands build their parser inside their ``main`` (generated from their typed settings), so each is
run with ``--help`` while ``print_help`` is intercepted: the parser it was about to print is captured, nothing is
printed and nothing else of the command runs. ``tests/test_cli_reference.py`` fails when the committed page is
stale or a flag has no help text.

Regenerate: ``.venv/bin/python -m ray_app.cli_reference`` (writes docs/cli.md; ``--check`` only compares).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kermt import cli as library_cli
from ray_app.cli import RAY_COMMANDS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
REGENERATE = ".venv/bin/python -m ray_app.cli_reference"
_ORIGINAL_PRINT_HELP = argparse.ArgumentParser.print_help
_TRAILING_DEFAULT = re.compile(r"\s*\((?:default: (?P<default>.*)|(?P<required>required))\)$", re.DOTALL)


@dataclass(frozen=True)
class Subcommand:
    name: str
    summary: str
    parser: argparse.ArgumentParser


class _ParserShown(BaseException):
    """Raised instead of printing help; a BaseException so no ``except Exception`` on the way swallows it."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


@contextlib.contextmanager
def _capturing_help() -> Iterator[None]:
    def capture(self: argparse.ArgumentParser, file=None) -> None:
        raise _ParserShown(self)

    argparse.ArgumentParser.print_help = capture
    try:
        yield
    finally:
        argparse.ArgumentParser.print_help = _ORIGINAL_PRINT_HELP


def _parser_of(name: str, run: Callable[[list[str]], int]) -> argparse.ArgumentParser:
    with _capturing_help():
        try:
            run(["--help"])
        except _ParserShown as shown:
            return shown.parser
    raise RuntimeError(f"kermt {name} --help printed no argparse help, so its flags cannot be documented")


def subcommands() -> list[Subcommand]:
    """Every ``kermt`` subcommand, in ``kermt --help``'s order: the library's, then the Ray ones."""
    top = library_cli.build_parser(library_cli.COMMANDS)
    library = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    found = [Subcommand(c.name, c.help, library.choices[c.name]) for c in library_cli.COMMANDS]
    return found + [Subcommand(n, summary, _parser_of(n, run)) for n, (summary, run) in RAY_COMMANDS.items()]


def _documented(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's arguments but ``--help`` and the hidden ``--no-X`` twins of on/off flags."""
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS]


def undocumented_flags() -> list[str]:
    """``kermt <command> --flag`` for every argument without help text (a hidden one with no visible twin too)."""
    missing = []
    for command in subcommands():
        shown = {a.dest for a in _documented(command.parser)}
        for action in command.parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            hidden_alone = action.help == argparse.SUPPRESS and action.dest not in shown
            if hidden_alone or not _description(action.help or ""):
                missing.append(f"kermt {command.name} {'/'.join(action.option_strings) or action.dest}")
    return missing


def _description(text: str) -> str:
    """The help text without the "(default: X)" / "(required)" that the settings schema appends to it."""
    return _TRAILING_DEFAULT.sub("", text).strip()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    invocation = formatter._format_action_invocation(action)
    text = formatter._expand_help(action) if action.help else ""
    match = _TRAILING_DEFAULT.search(text)
    default = ""
    if match:
        text = text[: match.start()]
        default = "required" if match["required"] else match["default"]
    elif action.required:
        default = "required"
    elif action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
        default = str(action.default)
    return f"| `{_cell(invocation)}` | {f'`{_cell(default)}`' if default else ''} | {_cell(text)} |"


def _section(command: Subcommand) -> list[str]:
    lines = [f"## kermt {command.name}", "", _cell(command.summary) + ".", ""]
    lines += ["| flag | default | description |", "| --- | --- | --- |"]
    return lines + [_row(command.parser, a) for a in _documented(command.parser)] + [""]


def render() -> str:
    commands = subcommands()
    lines = [
        "# CLI reference",
        "",
        "<!-- Generated by ray_app/cli_reference.py from the commands' argument parsers; do not edit by hand. "
        f"Regenerate with: {REGENERATE} -->",
        "",
        "Every subcommand of the `kermt` console script, with every flag, its default and its help, as "
        "`kermt <command> --help` prints them. An on/off flag `--X` that defaults to on is turned off with `--no-X`. "
        "The Ray subcommands also read `--config FILE.yaml` with the same keys as their flags (flags override it). "
        "`kermt --version` prints the version.",
        "",
    ]
    lines += [f"- [`kermt {c.name}`](#kermt-{c.name}): {_cell(c.summary)}" for c in commands] + [""]
    for command in commands:
        lines += _section(command)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    page = render()
    if "--check" in argv:
        stale = not PAGE.exists() or PAGE.read_text() != page
        print(f"{PAGE} is stale: regenerate it with {REGENERATE}" if stale else f"{PAGE} is up to date")
        return 1 if stale else 0
    PAGE.write_text(page)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
