"""docs/cli.md is rendered from the subcommands' own argument parsers (ray_app/cli_reference.py): it must be the
current render, and every flag must say what it does."""

from __future__ import annotations

import argparse

from ray_app import cli_reference
from ray_app.cli import RAY_COMMANDS


def test_every_flag_has_help_text():
    missing = cli_reference.undocumented_flags()
    assert not missing, ("flags without help text (give their settings field a description=... or their "
                         f"add_argument a help=...): {', '.join(missing)}")


def test_committed_reference_is_the_current_render():
    fresh = cli_reference.render()
    committed = cli_reference.PAGE.read_text() if cli_reference.PAGE.exists() else ""
    assert committed == fresh, (f"{cli_reference.PAGE} is stale (a subcommand or flag changed): regenerate it with "
                                f"`{cli_reference.REGENERATE}` and commit it")


def test_reference_covers_every_subcommand_and_flag():
    page = cli_reference.PAGE.read_text()
    for name in ["inspect", *RAY_COMMANDS]:
        assert f"## kermt {name}\n" in page
    finetune = next(c for c in cli_reference.subcommands() if c.name == "finetune")
    flags = [a.option_strings[0] for a in finetune.parser._actions
             if a.option_strings and a.help != argparse.SUPPRESS and a.option_strings[0] != "-h"]
    assert len(flags) > 60
    section = page.split("## kermt finetune\n")[1].split("\n## ")[0]
    assert all(f"| `{flag}" in section for flag in flags)
    assert "| `--epochs EPOCHS` | `30; without a checkpoint: 60` | training epochs |" in section
    assert "| `--data_path DATA_PATH` | `required` |" in section


def test_capturing_help_prints_nothing_and_restores_argparse(capsys):
    parser = cli_reference._parser_of("finetune", RAY_COMMANDS["finetune"][1])
    assert parser.prog == "kermt finetune"
    assert capsys.readouterr().out == ""
    assert argparse.ArgumentParser.print_help is cli_reference._ORIGINAL_PRINT_HELP
