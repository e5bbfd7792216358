"""`kermt explore` without a surrogate (--acquisition random trains none, so no Ray starts): explored.csv's content,
resuming after a finished round with the same choices, and bad input as one line before any work."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from kermt.explore.explored import read_explored
from ray_app.cli import main

DEMO = Path(__file__).resolve().parents[3] / "data" / "sample" / "admet_demo.csv"


def _logp() -> dict[str, str]:
    with DEMO.open(newline="") as f:
        return {row["smiles"]: row["logp"] for row in csv.DictReader(f)}


def _explore(save_dir: Path, *flags: str) -> int:
    return main(["explore", "--library", str(DEMO), "--objective", f"lookup:{DEMO}:logp", "--init_size", "0.01",
                 "--acquire_size", "15", "--acquisition", "random", "--seed", "7", "--save_dir", str(save_dir),
                 *flags])


def test_random_rounds_record_every_molecule_with_its_lookup_score(tmp_path, capsys):
    assert _explore(tmp_path / "run", "--iterations", "2") == 0
    printed = capsys.readouterr().out
    assert "round 0: 20 scored" in printed and "round 2: 15 scored" in printed
    explored = read_explored(str(tmp_path / "run" / "explored.csv"))
    assert explored.round.tolist() == [0] * 20 + [1] * 15 + [2] * 15  # 1 % of 2,000, then 15 a round
    assert len(set(explored.library_row.tolist())) == 50  # never the same row twice
    logp = _logp()
    demo_smiles = list(logp)
    for smiles, row, score, error in zip(explored.smiles, explored.library_row, explored.score, explored.error):
        assert demo_smiles[row] == smiles
        if logp[smiles]:
            assert (score, error) == (float(logp[smiles]), "")
        else:  # the demo leaves some logp cells empty: recorded, not fatal
            assert error == "no score in the lookup file" and score != score
    assert explored.predicted_mean.tolist() == [pytest.approx(float("nan"), nan_ok=True)] * 50


def test_a_resumed_exploration_makes_the_same_choices(tmp_path, capsys):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert _explore(whole, "--iterations", "3") == 0
    assert _explore(resumed, "--iterations", "1") == 0  # stopped after round 1 ...
    assert _explore(resumed, "--iterations", "3") == 0  # ... and run on to round 3
    assert "resuming" in capsys.readouterr().out
    assert (resumed / "explored.csv").read_text() == (whole / "explored.csv").read_text()
    shutil.copy(whole / "explored.csv", tmp_path / "kept.csv")
    assert _explore(whole, "--iterations", "3") == 0  # a finished exploration run again changes nothing
    assert (whole / "explored.csv").read_text() == (tmp_path / "kept.csv").read_text()


def test_other_settings_on_an_exploration_are_refused(tmp_path, capsys):
    assert _explore(tmp_path / "run", "--iterations", "1") == 0
    capsys.readouterr()
    assert _explore(tmp_path / "run", "--iterations", "1", "--minimize") == 2
    assert "holds an exploration with other settings (--minimize was False, now True)" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--init_size", "1.5"], "--init_size 1.5: a share of the library must be below 1"),
    (["--acquire_size", "3000"], "--acquire_size 3000 is larger than the library (2,000 molecules)"),
    (["--iterations", "200", "--acquire_size", "0.01"], "would score 4,020 molecules, more than the library's 2,000"),
    (["--acquisition", "ucb"], "--acquisition ucb needs the surrogate's uncertainty, and one model"),
    (["--objective", f"lookup:{DEMO}:logP"], "has no column 'logP' (did you mean 'logp'?)"),
    (["--objective", "dock.sh"], "expected lookup:FILE[:COLUMN], command:PROGRAM or python:MODULE:FUNCTION"),
    (["--library", "nowhere.csv"], "--library nowhere.csv does not exist or is not a file"),
])
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, flags, message):
    assert _explore(tmp_path / "run", "--iterations", "1", *flags) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run" / "explored.csv").exists()


def test_ctrl_c_keeps_the_finished_rounds_and_the_same_command_goes_on(tmp_path, monkeypatch, capsys):
    (tmp_path / "stoppable.py").write_text(
        "CALLS = []\nSTOP_AT = 2\n"
        "def length(smiles):\n"
        "    CALLS.append(len(smiles))\n"
        "    if len(CALLS) == STOP_AT:\n"
        "        raise KeyboardInterrupt\n"
        "    return [len(s) for s in smiles]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    flags = ["--objective", "python:stoppable:length", "--iterations", "2"]
    assert _explore(tmp_path / "run", *flags) == 130  # stopped while scoring round 1
    assert ("kermt explore: interrupted; " + str(tmp_path / "run" / "explored.csv") + " keeps rounds 0 to 0; the "
            "same command resumes at round 1") in capsys.readouterr().err
    assert read_explored(str(tmp_path / "run" / "explored.csv")).rounds_done == 1
    assert _explore(tmp_path / "run", *flags) == 0
    explored = read_explored(str(tmp_path / "run" / "explored.csv"))
    assert explored.round.tolist() == [0] * 20 + [1] * 15 + [2] * 15
    assert explored.score.tolist() == [float(len(s)) for s in explored.smiles]
