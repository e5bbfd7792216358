"""`kermt <command> --help` shows each setting's default (from the typed config, since the parser's defaults are
left unset to tell what the user typed); `kermt --version` prints the installed package's version."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from ray_app import cli
from ray_app.common.settings import resolve
from ray_app.finetune.config import FinetuneConfig
from tests.conftest import FIXTURE_DIR


# What `kermt <command> --help` must not import: each costs from a tenth of a second (pyarrow) to seconds (torch, ray)
HEAVY = ("ray", "torch", "pyarrow", "pandas", "sklearn", "scipy", "rdkit", "fastapi")


def help_text(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width


def test_finetune_help_shows_defaults(capsys):
    text = help_text(capsys, ["finetune", "--help"])
    assert "--seed SEED seed of splits, initialisation, shuffling and dynamic depth (default: 0)" in text
    assert "--split_sizes SPLIT_SIZES SPLIT_SIZES SPLIT_SIZES train/val/test fractions (default: 0.8 0.1 0.1)" in text
    # a setting the from-scratch recipe fills differently says both (kermt.presets.FROM_SCRATCH_TRAINING)
    assert "--epochs EPOCHS training epochs (default: 30; without a checkpoint: 60)" in text
    assert "--dropout DROPOUT dropout probability (encoder and FFN head) (default: 0.0)" in text
    assert "--data_path DATA_PATH CSV (also .csv.gz/.bz2/.zst) or Parquet with a SMILES column and targets " \
           "(required)" in text
    # a default the description explains, an unset one and an off switch add nothing
    assert "--smiles_column SMILES_COLUMN SMILES column (default: the first column) --target_columns" in text
    assert "--tensorboard write TensorBoard events --metric" in text


def test_screening_and_tune_help_show_defaults(capsys):
    assert ("--batch_size BATCH_SIZE molecules per model batch (no number depends on it, except with "
            "--upstream_batching: docs/numerics.md) (default: 32)") in help_text(capsys, ["predict", "--help"])
    assert "--n_trials N_TRIALS trials to run (as upstream, required) --hpo_mode" in (
        text := help_text(capsys, ["tune", "--help"]))
    assert "--search {optuna,random} Optuna TPE or random sampling (seeded) (default: optuna)" in text


def test_given_settings_are_still_told_from_defaults():
    config, sources = resolve(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--epochs", "30"], FinetuneConfig,
                              "kermt finetune")
    assert config.epochs == 30 and sources["epochs"] == "user" and sources["seed"] == "default"


def test_version_is_the_installed_package_metadata(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kermt {metadata.version('kermt-ray')} (kermt-ray)"


@pytest.mark.parametrize("command", ["predict", "eval", "fingerprint", "embed", "reconstruct", "finetune", "tune",
                                     "corpus", "pretrain", "serve", "explore"])
def test_a_commands_help_imports_no_heavy_library(command):
    """`kermt predict --help` in well under a second: the help path imports the settings, not the runners."""
    code = ("import sys, io, contextlib\nfrom ray_app.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    assert main([{command!r}, '--help']) == 0\n"
            "print(sorted(m for m in HEAVY if m in sys.modules))").replace("HEAVY", repr(HEAVY))
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert loaded.strip() == "[]"
