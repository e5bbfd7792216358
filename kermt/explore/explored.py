"""``DIR/explored.csv``: every molecule an exploration has asked to score, one row each, in acquisition order.

Columns (:data:`EXPLORED_COLUMNS`): ``smiles``; ``score`` (empty where scoring failed); ``round`` (0: the random
first batch); ``predicted_mean`` and ``predicted_std``, the surrogate's prediction when the molecule was acquired
(empty in round 0, and the std for a surrogate without uncertainty); ``acquisition_value`` (what the acquisition
function gave it; empty in round 0); ``library_row`` (its 0-based data row in ``--library``: the same SMILES may
appear on two rows); ``error`` (why it has no score: the scorer's failure, a timeout, a lookup without it).

Each scored round is appended (:func:`append_round`), so recording round k costs its own rows, not the k rounds
before it, and the rows go through ``csv.writer`` onto the open file (its buffer is all the memory they take).
Beside the file, ``explored.rounds.json`` (``EXPLORED_RECORD_FILE``, rewritten atomically) holds the length in bytes
and rows of the file's whole rounds: it is written only after a round's rows are flushed and fsync'ed, so the round
is recorded then and not before. Readers (:func:`read_explored`: resuming, ``kermt report``) read that many bytes
and never see half a round; an append first cuts the file back to that length, dropping the rows of a round that
was stopped mid-append (that round is then acquired again, with the same choices). A file without the record was
written whole (:func:`write_explored`, or before the record existed) and is read whole. The file stays a plain CSV
with the same columns; only a stopped run's file, until the run resumes, can end in rows that readers ignore.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np

from kermt.data.atomic_files import write_text
from kermt.errors import UserError
from kermt.run_layout import EXPLORED_RECORD_FILE

ROWS_AT_ONCE = 1024  # rows a chunk: ~0.4 MB of Python cells, and no slower than more

EXPLORED_COLUMNS = ("smiles", "score", "round", "predicted_mean", "predicted_std", "acquisition_value",
                    "library_row", "error")
_HEADER = ",".join(EXPLORED_COLUMNS) + "\n"


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


def append_round(path: str, batch: Explored) -> None:
    """Appends one scored round's rows to explored.csv (made, header only, if absent); the round is recorded when
    its rows are flushed and fsync'ed and the record names the new length, never before."""
    record = _record_of(path) if os.path.exists(path) else _header_only(path)
    _cut_to(path, record)  # rows of a round stopped mid-append: never recorded, that round is acquired again
    with open(path, "a", newline="", encoding="utf-8") as out:
        _write_rows(out, batch)
        out.flush()
        os.fsync(out.fileno())
        size = os.fstat(out.fileno()).st_size
    rounds = max(record["rounds"], batch.rounds_done)
    _write_record(path, {"bytes": size, "rows": record["rows"] + len(batch), "rounds": rounds})


def write_explored(path: str, explored: Explored) -> None:
    """explored.csv whole, atomically (a reader sees the old file or this one), with its record: what cuts an
    exploration back to fewer rounds; a run appends (:func:`append_round`)."""
    record = record_path(path)
    if record.exists():
        # cut the old file to its whole rounds first: without its record it is read whole until the new one lands
        _cut_to(path, _read_record(record, path))
        record.unlink()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as out:
            out.write(_HEADER)
            _write_rows(out, explored)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _write_record(path, {"bytes": os.path.getsize(path), "rows": len(explored), "rounds": explored.rounds_done})


def record_path(path: str) -> Path:
    """explored.csv's record (the length of its whole rounds), beside it."""
    return Path(path).parent / EXPLORED_RECORD_FILE


def _write_rows(out: TextIO, explored: Explored) -> None:
    """The rows through csv.writer onto ``out``, ``ROWS_AT_ONCE`` at a time: each chunk's columns become Python
    lists at once (cell by cell took 1.6 times as long), the chunk and the file's buffer bound the memory."""
    writer = csv.writer(out, lineterminator="\n")
    for start in range(0, len(explored), ROWS_AT_ONCE):
        rows = slice(start, start + ROWS_AT_ONCE)
        writer.writerows(zip(explored.smiles[rows], _cells(explored.score[rows]), explored.round[rows].tolist(),
                             _cells(explored.predicted_mean[rows]), _cells(explored.predicted_std[rows]),
                             _cells(explored.acquisition_value[rows]), explored.library_row[rows].tolist(),
                             explored.error[rows]))


def _cells(values: np.ndarray) -> list[str]:
    """Floats as repr writes them (they read back exactly), empty for NaN."""
    return ["" if math.isnan(value) else repr(value) for value in values.astype(np.float64).tolist()]


def _record_of(path: str) -> dict[str, int]:
    """The record of ``path``; a file without one (written before records existed) is whole, so it is its own."""
    record = record_path(path)
    if record.exists():
        return _read_record(record, path)
    whole = read_explored(path)
    recorded = {"bytes": os.path.getsize(path), "rows": len(whole), "rounds": whole.rounds_done}
    _write_record(path, recorded)
    return recorded


def _header_only(path: str) -> dict[str, int]:
    """A new explored.csv, its header only, and its record, written before any row: without it, a stop in round 0's
    append would leave a file of part of a round that reads as whole."""
    write_text(path, _HEADER)
    recorded = {"bytes": len(_HEADER.encode("utf-8")), "rows": 0, "rounds": 0}
    _write_record(path, recorded)
    return recorded


def _read_record(record: Path, path: str) -> dict[str, int]:
    try:
        recorded = json.loads(record.read_text())
        return {key: int(recorded[key]) for key in ("bytes", "rows", "rounds")}
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{record} is not the record of {path} ({error}); restore it, or delete it if {path} "
                        "holds only whole rounds") from None


def _write_record(path: str, recorded: dict[str, int]) -> None:
    write_text(str(record_path(path)), json.dumps(recorded) + "\n")


def _cut_to(path: str, recorded: dict[str, int]) -> None:
    size = os.path.getsize(path)
    _check_size(path, size, recorded)
    if size > recorded["bytes"]:
        os.truncate(path, recorded["bytes"])


def _check_size(path: str, size: int, recorded: dict[str, int]) -> None:
    if size < recorded["bytes"]:
        raise UserError(f"{path} has {size:,} bytes, its record {recorded['bytes']:,}: the file was changed by hand; "
                        "restore it or give another --save_dir")


def read_explored(path: str) -> Explored:
    """explored.csv's whole rounds back into columns (the bytes its record names, the whole file without one); a
    file that is not one is a one-line error naming it."""
    with open(path, "rb") as f:  # opened before the record is read: the bytes it names are already in this file
        record = record_path(path)
        recorded = _read_record(record, path) if record.exists() else None
        if recorded:
            _check_size(path, os.fstat(f.fileno()).st_size, recorded)
        rows = list(csv.reader(_lines(f, recorded["bytes"] if recorded else None)))
    if not rows or tuple(rows[0]) != EXPLORED_COLUMNS:
        raise UserError(f"{path} is not an explored.csv of kermt explore (its header is not "
                        f"{','.join(EXPLORED_COLUMNS)}); give another --save_dir")
    body = rows[1:]
    if recorded and len(body) != recorded["rows"]:
        raise UserError(f"{path} holds {len(body):,} rows where its record says {recorded['rows']:,}: the file was "
                        "changed by hand; restore it or give another --save_dir")
    for line, row in enumerate(body, start=2):
        if len(row) != len(EXPLORED_COLUMNS):
            raise UserError(f"{path} line {line}: {len(row)} cells, expected {len(EXPLORED_COLUMNS)}; the file was "
                            "changed by hand: restore it or give another --save_dir")

    def numbers(column: int, dtype=np.float64) -> np.ndarray:
        return np.array([float(row[column]) if row[column] else math.nan for row in body], dtype=np.float64
                        ).astype(dtype)

    return Explored([row[0] for row in body], numbers(1), numbers(2, np.int64), numbers(3), numbers(4),
                    numbers(5), numbers(6, np.int64), [row[7] for row in body])


def _lines(f: BinaryIO, end: int | None) -> Iterator[str]:
    """The file's lines up to byte ``end`` (all without it), decoded: a quoted newline inside a cell splits a row
    over two lines, which csv.reader joins again."""
    left = math.inf if end is None else end
    for line in f:
        if left <= 0:
            return
        line = line[:left] if len(line) > left else line
        left -= len(line)
        yield line.decode("utf-8")


__all__ = ["EXPLORED_COLUMNS", "Explored", "append_round", "read_explored", "record_path", "write_explored"]
