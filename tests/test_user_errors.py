"""User errors through the installed entry points (real subprocesses): one line ``kermt <cmd>: error: ...`` on
stderr naming the file/row/column/key, exit status 2, no traceback. All are detected before Ray starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_DIR

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
SMILES_CSV = str(FIXTURE_DIR / "smiles.csv")  # smiles,t1,t2


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    (root / "bad_label.csv").write_text("smiles,y\nCCO,1.5\nCCC,abc\nCCCC,2\n")
    (root / "notes.pt").write_text("not a checkpoint, just text\n")
    (root / "run.yaml").write_text(f"data_path: {SMILES_CSV}\nbatchsize: 32\n")
    (root / "library.sdf").write_text("\n")
    (root / "semicolon.csv").write_text("smiles;SOL\nCCO;1.2\nCCC;0.5\n")
    (root / "named.csv").write_text("name,smiles,SOL\nethanol,CCO,1.2\npropane,CCC,0.5\n")
    return root


CASES = {
    "missing data file": (["kermt", "finetune", "--data_path", "{root}/missing.csv"],
                          "kermt finetune", ["data file not found", "missing.csv"]),
    "non-numeric label": (["kermt", "finetune", "--data_path", "{root}/bad_label.csv"],
                          "kermt finetune", ["bad_label.csv: line 3, column 'y'", "'abc' is not a number"]),
    "not a checkpoint": (["kermt", "finetune", "--data_path", SMILES_CSV, "--checkpoint_path", "{root}/notes.pt"],
                         "kermt finetune", ["notes.pt is not a checkpoint"]),
    "inspect not a checkpoint": (["kermt", "inspect", "{root}/notes.pt"], "kermt inspect",
                                 ["notes.pt is not a checkpoint"]),
    "unknown config key": (["kermt", "finetune", "--config", "{root}/run.yaml"], "kermt finetune",
                           ["run.yaml", "unknown key 'batchsize'", "did you mean 'batch_size'"]),
    "bad SMILES column": (["kermt", "finetune", "--data_path", SMILES_CSV, "--smiles_column", "smile"],
                          "kermt finetune", ["smiles.csv", "no column 'smile'", "did you mean 'smiles'"]),
    "unknown extension": (["kermt", "finetune", "--data_path", "{root}/library.sdf"], "kermt finetune",
                          ["library.sdf", "unknown input format '.sdf'", ".csv", ".smi", ".parquet"]),
    "';'-separated csv": (["kermt", "finetune", "--data_path", "{root}/semicolon.csv"], "kermt finetune",
                          ["semicolon.csv: looks ';'-separated", "save it with commas"]),
    "SMILES not first": (["kermt", "tune", "--data_path", "{root}/named.csv", "--n_trials", "2"], "kermt tune",
                         ["named.csv: the first column, 'name',", "did you mean `--smiles_column smiles`?"]),
    "bad flag value": (["kermt", "finetune", "--data_path", SMILES_CSV, "--dataset_type", "regresion"],
                       "kermt finetune", ["--dataset_type", "'regresion'"]),
    "tune: non-numeric label": (["kermt", "tune", "--data_path", "{root}/bad_label.csv", "--n_trials", "2"],
                                "kermt tune", ["bad_label.csv", "column 'y'"]),
    "job entry point": (["python", "-m", "jobs.finetune", "--data_path", "{root}/missing.csv"], "kermt finetune",
                        ["missing.csv"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line_and_exit_2(inputs, case):
    argv, prog, words = CASES[case]
    command = [str(BIN / argv[0]), *(a.format(root=inputs) for a in argv[1:])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for word in words:
        assert word in lines[0]


def test_a_bug_keeps_its_traceback(tmp_path):
    """Not every exception is a user error: a failure that is not one propagates with its traceback, exit 1."""
    script = ("import sys; from kermt.errors import run_reporting_user_errors as r; "
              "sys.exit(r('kermt x', lambda: {}['missing']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 1 and "Traceback" in done.stderr and "KeyError" in done.stderr
