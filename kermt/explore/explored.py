"""``DIR/explored.csv``: every molecule an exploration has asked to score, one row each, in acquisition order.

Columns (:data:`EXPLORED_COLUMNS`): ``smiles``; ``score`` (empty where scoring failed); ``round`` (0: the random
first batch); ``predicted_mean`` and ``predicted_std``, the surrogate's prediction when the molecule was acquired
(empty in round 0, and the std for a surrogate without uncertainty); ``acquisition_value`` (what the acquisition
function gave it; empty in round 0); ``library_row`` (its 0-based data row in ``--library``: the same SMILES may
appear on two rows); ``error`` (why it has no score: the scorer's failure, a timeout, a lookup without it).

The file is rewritten whole, atomically, after each round is scored, so it always holds whole rounds: a run that
stops mid-round resumes at that round (its acquisition is computed again from the same inputs and seeds).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

import numpy as np

from kermt.data.atomic_files import write_text
from kermt.errors import UserError

EXPLORED_COLUMNS = ("smiles", "score", "round", "predicted_mean", "predicted_std", "acquisition_value",
                    "library_row", "error")


@dataclass
class Explored:
    """The rows of explored.csv as columns (numbers float64/int64, NaN where empty)."""

    smiles: list[str] = field(default_factory=list)
    score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    round: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    predicted_mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    predicted_std: np.ndarray = field(default_factory=lambda: np.zeros(0))
    acquisition_value: np.ndarray = field(default_factory=lambda: np.zeros(0))
    library_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    error: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.smiles)

    @property
    def rounds_done(self) -> int:
        """Rounds recorded (0 .. rounds_done - 1): the next round's index."""
        return int(self.round.max()) + 1 if len(self) else 0

    @property
    def scored(self) -> np.ndarray:
        """bool [n]: the rows with a score."""
        return np.isfinite(self.score)

    def before_round(self, round_index: int) -> "Explored":
        """The rows of the rounds before ``round_index``."""
        return self.select(np.flatnonzero(self.round < round_index))

    def select(self, rows: np.ndarray) -> "Explored":
        return Explored([self.smiles[i] for i in rows], self.score[rows], self.round[rows],
                        self.predicted_mean[rows], self.predicted_std[rows], self.acquisition_value[rows],
                        self.library_row[rows], [self.error[i] for i in rows])

    def extended(self, batch: "Explored") -> "Explored":
        """These rows followed by ``batch``'s."""
        return Explored(self.smiles + batch.smiles, *(np.concatenate([getattr(self, name), getattr(batch, name)])
                                                      for name in EXPLORED_COLUMNS[1:-1]),
                        self.error + batch.error)


def write_explored(path: str, explored: Explored) -> None:
    """explored.csv, atomically (a reader never sees half a round)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(EXPLORED_COLUMNS)
    for i in range(len(explored)):
        writer.writerow([explored.smiles[i], _cell(explored.score[i]), int(explored.round[i]),
                         _cell(explored.predicted_mean[i]), _cell(explored.predicted_std[i]),
                         _cell(explored.acquisition_value[i]), int(explored.library_row[i]), explored.error[i]])
    write_text(path, out.getvalue())


def _cell(value: float) -> str:
    return "" if math.isnan(value) else repr(float(value))


def read_explored(path: str) -> Explored:
    """explored.csv back into columns; a file that is not one is a one-line error naming it."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != EXPLORED_COLUMNS:
        raise UserError(f"{path} is not an explored.csv of kermt explore (its header is not "
                        f"{','.join(EXPLORED_COLUMNS)}); give another --save_dir")
    body = rows[1:]
    for line, row in enumerate(body, start=2):
        if len(row) != len(EXPLORED_COLUMNS):
            raise UserError(f"{path} line {line}: {len(row)} cells, expected {len(EXPLORED_COLUMNS)}; the file was "
                            "changed by hand: restore it or give another --save_dir")

    def numbers(column: int, dtype=np.float64) -> np.ndarray:
        return np.array([float(row[column]) if row[column] else math.nan for row in body], dtype=np.float64
                        ).astype(dtype)

    return Explored([row[0] for row in body], numbers(1), numbers(2, np.int64), numbers(3), numbers(4),
                    numbers(5), numbers(6, np.int64), [row[7] for row in body])


__all__ = ["EXPLORED_COLUMNS", "Explored", "read_explored", "write_explored"]
