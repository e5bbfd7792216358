"""ray_app.common.command.run_command: every command that writes refuses an output whose folder cannot be made or
written, in one line naming the flag and the path, before Ray starts (no cluster in these tests)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ray_app import cli
from tests.conftest import FIXTURE_DIR

SMILES_CSV = str(FIXTURE_DIR / "smiles.csv")
FT_REG = str(FIXTURE_DIR / "ckpt_ft_reg.pt")
AS_ROOT = os.geteuid() == 0

# command -> (its arguments but the output, the output flag, the output's name inside the unwritable folder)
COMMANDS = {
    "predict": (["--data_path", SMILES_CSV, "--checkpoint_path", FT_REG], "--output_path", "preds.csv"),
    "eval": (["--data_path", SMILES_CSV, "--checkpoint_path", FT_REG], "--output_path", "test_result.csv"),
    "fingerprint": (["--data_path", SMILES_CSV, "--checkpoint_path", FT_REG], "--output_path", "fps.npz"),
    "embed": (["--data_path", SMILES_CSV, "--checkpoint_path", FT_REG], "--output_path", "emb.parquet"),
    "reconstruct": (["--data_path", SMILES_CSV, "--checkpoint_path", FT_REG], "--output_path", "gen.csv"),
    "finetune": (["--data_path", SMILES_CSV], "--save_dir", "run"),
    "tune": (["--data_path", SMILES_CSV, "--n_trials", "2"], "--save_dir", "sweep"),
    "pretrain": (["--data_path", str(FIXTURE_DIR)], "--save_dir", "run"),
    "corpus": (["--data_path", SMILES_CSV], "--save_dir", "corpus"),
}


@pytest.fixture(params=["proc", "read-only"])
def unwritable(request, tmp_path) -> Iterator[Path]:
    """A folder no output can go in: under /proc (nobody creates folders there, root included), or a chmod 555
    folder (root may write there, as the run then could: only tried as another user)."""
    if request.param == "proc":
        yield Path("/proc/kermt-test")
        return
    if AS_ROOT:
        pytest.skip("root writes into a chmod 555 folder; the /proc case covers root")
    tmp_path.chmod(0o555)
    yield tmp_path
    tmp_path.chmod(0o755)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unwritable_output_is_one_line_before_ray_starts(command, unwritable, capsys):
    arguments, flag, name = COMMANDS[command]
    output = unwritable / name
    assert cli.main([command, *arguments, flag, str(output)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1, captured.err
    folder = output if flag == "--save_dir" else unwritable
    why = "create the folder" if flag == "--save_dir" or not unwritable.exists() else "write in"
    reason = "Permission denied" if unwritable.exists() else "No such file or directory"
    assert captured.err == (f"kermt {command}: error: {flag} {output}: cannot {why} {folder} ({reason}); give a path "
                            "in a folder you can write to\n")
    assert not output.exists()
