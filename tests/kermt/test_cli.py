"""The ``kermt`` console script: ``inspect`` in-process and through the installed entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kermt.cli import build_parser, main
from kermt.errors import UserError
from tests.conftest import FIXTURE_DIR

KERMT_SCRIPT = Path(sys.executable).with_name("kermt")


class _ShellOnUnpickle:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name,kind", [("ckpt_pretrain_vocab", "vocab"), ("ckpt_pretrain_hybrid", "hybrid"),
                                       ("ckpt_ft_reg", "finetuned"), ("ckpt_ft_reg_ts", "finetuned"),
                                       ("ckpt_ft_cls", "finetuned")])
def test_inspect_prints_json_report(capsys, name, kind):
    assert main(["inspect", str(FIXTURE_DIR / f"{name}.pt")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == kind
    assert report["architecture"]["encoder"]["depth"] == 3


def test_inspect_refuses_code_running_checkpoint(tmp_path, capsys):
    marker = tmp_path / "marker"
    torch.save({"args": _ShellOnUnpickle(marker), "state_dict": {}}, tmp_path / "evil.pt")
    assert main(["inspect", str(tmp_path / "evil.pt")]) == 2
    error = capsys.readouterr().err
    assert "evil.pt" in error and "system" in error and "--trust_checkpoint" in error
    assert not marker.exists()


def test_subcommands_are_registered_through_one_table():
    parser = build_parser()
    with pytest.raises(UserError, match="required: COMMAND"):  # one line from main, not usage text
        parser.parse_args([])
    args = parser.parse_args(["inspect", "x.pt", "--trust_checkpoint"])
    assert args.command == "inspect" and args.trust_checkpoint is True


@pytest.mark.skipif(not KERMT_SCRIPT.is_file(), reason="kermt console script not installed in this environment")
def test_installed_console_script(tmp_path):
    done = subprocess.run([str(KERMT_SCRIPT), "inspect", str(FIXTURE_DIR / "ckpt_ft_reg.pt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kind"] == "finetuned" and report["tasks"]["task_names"] == ["t1", "t2"]
    assert report["scalers"]["data_scaler"]["stds"] == pytest.approx([1.59861404, 0.90467526], abs=1e-8)
    missing = subprocess.run([str(KERMT_SCRIPT), "inspect", str(tmp_path / "none.pt")],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "none.pt does not exist" in missing.stderr
