"""Reading upstream's ``test_result.csv`` layout (what a finetune fold and `kermt eval` write): a blank-headed SMILES
column, then ``preds`` per task and ``targets`` per task under two header rows; a blinded file (no targets) has one
header row of task names."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kermt.errors import UserError
from kermt.inference.columns import DISTANCE_COLUMN


@dataclass
class TestResult:
    smiles: list[str]
    tasks: list[str]
    preds: np.ndarray  # [N, T]
    targets: np.ndarray | None  # [N, T], NaN = no label; None for a blinded file

    __test__ = False  # not a pytest class


def _number(cell: str) -> float:
    return float(cell) if cell.strip() else float("nan")


def read_test_result(path: Path) -> TestResult:
    """The file's SMILES, tasks, predictions and (when it has them) measured values."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise UserError(f"{path}: empty; expected upstream's test_result.csv layout")
    if rows[0] and rows[0][0].strip():
        raise UserError(f"{path}: its first column is named {rows[0][0]!r}, so it reads as an input file, not a "
                        "scored one (kermt eval and upstream leave that header cell blank); kermt report reads what "
                        "kermt eval or kermt predict wrote, or a run's --save_dir: to score this file, kermt eval "
                        f"--data_path {path} --checkpoint_path MODEL --output_path scored.csv")
    two_headers = len(rows) > 1 and "targets" in rows[0][1:] and rows[0][1] == "preds"
    if two_headers:
        n_tasks = rows[0][1:].count("preds")
        tasks, body = rows[1][1:1 + n_tasks], rows[2:]
    else:
        tasks, body = rows[0][1:], rows[1:]
        n_tasks = len(tasks)
    try:
        columns = 2 * n_tasks if two_headers else n_tasks  # a run without a test split wrote no row (kermt explore)
        values = np.array([[_number(c) for c in row[1:]] for row in body], dtype=np.float64).reshape(len(body), columns)
    except ValueError as error:
        raise UserError(f"{path}: a cell is not a number ({error}); expected upstream's test_result.csv") from error
    preds = values[:, :n_tasks]
    targets = values[:, n_tasks:2 * n_tasks] if two_headers else None
    return TestResult([row[0] for row in body], tasks, preds, targets)


def read_spread(path: Path, tasks: list[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The members' spread per test molecule [N, T] (``fold_k/test_spread.csv``, one header row) and, when the run
    wrote it (a mondrian_domain calibration), each one's ``domain_distance`` [N]; (None, None) when the run did not
    write the file (older runs) or its tasks differ."""
    if not path.exists():
        return None, None
    spread = read_test_result(path)
    if spread.tasks == [*tasks, DISTANCE_COLUMN]:
        return spread.preds[:, :-1], spread.preds[:, -1]
    return (spread.preds, None) if spread.tasks == tasks else (None, None)


__all__ = ["TestResult", "read_spread", "read_test_result"]
