"""What a `kermt predict` output file holds, in bounded memory: the file is streamed in batches of at most
``BATCH_ROWS`` rows (pyarrow reads only the columns the report shows), twice: the first pass counts rows, invalid
rows by reason, moments and ranges of every numeric column and keeps each task's top molecules; the second counts
exact histograms over those ranges. Memory is a batch plus a few numbers per column, whatever the library's size.

The output's layout (ray_app.screening.stream.PredictStage): the SMILES column, a column per task, then when asked
``<task>_std``, ``<task>_lower``/``<task>_upper``, ``<task>_calibrated``, ``<task>_set``,
``<task>_atoms``/``<task>_baseline``/``<task>_descriptors``, ``domain_distance``/``in_domain``, then the carried input
columns, ``valid`` and ``error`` (kermt.inference.columns).
"""

from __future__ import annotations

import csv
import heapq
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from kermt.inference.columns import (ATOMS_SUFFIX, ATTRIBUTION_SUFFIXES, DISTANCE_COLUMN, IN_DOMAIN_COLUMN,
                                     LOWER_SUFFIX, MODEL_SMILES_COLUMN, STD_SUFFIX, TASK_SUFFIXES, UPPER_SUFFIX)

BATCH_ROWS = 65_536
CSV_BLOCK_BYTES = 1 << 20  # the reader reads ahead some blocks: small ones bound its memory (~40 MB)
BINS = 40
TOP_N = 12
EXAMPLES = 3
BOOLEAN = ("valid", IN_DOMAIN_COLUMN)


def is_prediction_output(path: Path) -> bool:
    """A file `kermt predict` wrote (Parquet, or a CSV with its ``valid`` and ``error`` columns), not one
    `kermt eval` scored (upstream's test_result.csv layout)."""
    return path.suffix.lower() == ".parquet" or {"valid", "error"} <= set(header(path))


def header(path: Path) -> list[str]:
    if path.suffix.lower() == ".parquet":
        return pq.ParquetFile(path).schema_arrow.names
    with open(path, newline="") as f:
        return next(csv.reader(f), [])


def batches(path: Path, columns: Sequence[str], text: Sequence[str] = ()) -> Iterator[pa.RecordBatch]:
    """The file's rows, ``columns`` only, batch after batch (from a CSV: ``text`` and ``error`` as strings, flags
    as booleans, the rest as float64)."""
    if path.suffix.lower() == ".parquet":
        yield from pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=list(columns))
        return
    types = {c: pa.bool_() if c in BOOLEAN else pa.float64() for c in columns}
    types.update({c: pa.string() for c in columns if c == "error" or c in text})
    reader = pa_csv.open_csv(path, read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                             convert_options=pa_csv.ConvertOptions(include_columns=list(columns), column_types=types))
    yield from reader


@dataclass(frozen=True)
class OutputLayout:
    smiles: str
    tasks: tuple[str, ...]
    std: dict[str, str]  # task -> its column, for the columns present
    lower: dict[str, str]
    upper: dict[str, str]
    distance: str | None
    in_domain: str | None
    # --attributions' columns (and model_smiles beside them), read with the rows and kept with the top ones, so
    # that the report draws the top molecules by the file's values instead of computing them again
    attributions: tuple[str, ...] = ()

    def numeric(self) -> list[str]:
        return [*self.tasks, *self.std.values(), *self.lower.values(), *self.upper.values(),
                *([self.distance] if self.distance else [])]

    def columns(self) -> list[str]:
        return [self.smiles, *self.numeric(), *([self.in_domain] if self.in_domain else []), *self.attributions,
                "valid", "error"]

    def text(self) -> list[str]:
        """The columns read as strings (besides ``error``): the SMILES, the atoms' JSON lists, model_smiles."""
        return [self.smiles, *(c for c in self.attributions if c.endswith(ATOMS_SUFFIX) or c == MODEL_SMILES_COLUMN)]


def output_layout(path: Path, tasks: Sequence[str] | None = None) -> OutputLayout:
    """The columns of the output; ``tasks``: the model's (the run knows them), else read off the file: the
    columns after the SMILES up to the first that is a suffix column, a domain column, ``valid``/``error``, or
    filled on a row the model rejected (a carried input column; checked on the first batch)."""
    names = header(path)
    if tasks is None:
        tasks = _tasks_read_off(path, names)
    present = set(names)

    def pick(suffix: str) -> dict[str, str]:
        return {t: t + suffix for t in tasks if t + suffix in present}

    explained = [t for t in tasks if t + ATOMS_SUFFIX in present]
    attributions = tuple(c for t in explained for c in (t + s for s in ATTRIBUTION_SUFFIXES) if c in present)
    return OutputLayout(names[0], tuple(tasks), pick(STD_SUFFIX), pick(LOWER_SUFFIX), pick(UPPER_SUFFIX),
                        DISTANCE_COLUMN if DISTANCE_COLUMN in present else None,
                        IN_DOMAIN_COLUMN if IN_DOMAIN_COLUMN in present else None,
                        attributions + ((MODEL_SMILES_COLUMN,) if explained and MODEL_SMILES_COLUMN in present else ()))


def _tasks_read_off(path: Path, names: list[str]) -> list[str]:
    candidates = []
    for name in names[1:]:
        if name in ("valid", "error", DISTANCE_COLUMN, IN_DOMAIN_COLUMN) or any(
                name == task + suffix for task in candidates for suffix in TASK_SUFFIXES):
            break
        candidates.append(name)
    if path.suffix.lower() != ".parquet":  # a CSV's text columns (ids) read as numbers would fail below
        first = next(pa_csv.open_csv(path, read_options=pa_csv.ReadOptions(block_size=1 << 20)), None)
        types = {} if first is None else dict(zip(first.schema.names, first.schema.types))
        candidates = list(_while(candidates, lambda c: pa.types.is_integer(types.get(c)) or
                                 pa.types.is_floating(types.get(c)) or pa.types.is_null(types.get(c))))
    first = next(batches(path, [*candidates, "valid"]), None)
    if first is None:
        return candidates
    invalid = ~first.column("valid").to_numpy(zero_copy_only=False).astype(bool)
    return list(_while(candidates, lambda c: pa.types.is_floating(first.column(c).type) and
                       not np.isfinite(_floats(first.column(c))[invalid]).any()))


def _while(names: list[str], holds) -> Iterator[str]:
    for name in names:
        if not holds(name):
            return
        yield name


def _floats(column: pa.Array) -> np.ndarray:
    return np.asarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


@dataclass
class Moments:
    """Count, mean, standard deviation and range of the finite values seen."""

    count: int = 0
    total: float = 0.0
    squares: float = 0.0
    low: float = np.inf
    high: float = -np.inf

    def add(self, values: np.ndarray) -> None:
        values = values[np.isfinite(values)]
        if values.size:
            self.count += values.size
            self.total += float(values.sum())
            self.squares += float(np.square(values).sum())
            self.low, self.high = min(self.low, float(values.min())), max(self.high, float(values.max()))

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else np.nan

    @property
    def std(self) -> float:
        return float(np.sqrt(max(self.squares / self.count - self.mean ** 2, 0.0))) if self.count else np.nan

    def edges(self, bins: int) -> np.ndarray:
        low, high = (self.low, self.high) if self.high > self.low else (self.low - 0.5, self.low + 0.5)
        return np.linspace(low, high, bins + 1)


@dataclass
class LibraryStats:
    layout: OutputLayout
    rows: int = 0
    valid: int = 0
    reasons: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    moments: dict[str, Moments] = field(default_factory=dict)  # per numeric column
    widths: dict[str, Moments] = field(default_factory=dict)  # per task: upper - lower
    in_domain: tuple[int, int] = (0, 0)  # (rows in domain, rows with a verdict)
    top: dict[str, list[tuple[float, int, dict]]] = field(default_factory=dict)  # per task: heap of (value, row, row)
    histograms: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # per column: edges, counts
    seconds: float = 0.0

    def top_rows(self, task: str) -> list[dict]:
        return [row for _, _, row in sorted(self.top.get(task, []), key=lambda item: (-item[0], -item[1]))]


def library_stats(path: Path, tasks: Sequence[str] | None = None, top_n: int = TOP_N, bins: int = BINS) \
        -> LibraryStats:
    started = time.perf_counter()
    stats = LibraryStats(output_layout(path, tasks))
    layout = stats.layout
    stats.moments = {c: Moments() for c in layout.numeric()}
    stats.widths = {t: Moments() for t in layout.lower if t in layout.upper}
    for batch in batches(path, layout.columns(), text=layout.text()):
        _count(stats, batch, top_n)
    shown = [*layout.tasks, *([layout.distance] if layout.distance else [])]
    counts = {c: np.zeros(bins, dtype=np.int64) for c in shown}
    edges = {c: stats.moments[c].edges(bins) for c in shown}
    for batch in batches(path, shown) if stats.valid else ():
        for column in shown:
            values = _floats(batch.column(column))
            counts[column] += np.histogram(values[np.isfinite(values)], bins=edges[column])[0]
    stats.histograms = {c: (edges[c], counts[c]) for c in shown}
    stats.seconds = time.perf_counter() - started
    return stats


def _count(stats: LibraryStats, batch: pa.RecordBatch, top_n: int) -> None:
    """The first pass over one batch."""
    layout, first_row = stats.layout, stats.rows
    valid = batch.column("valid").to_numpy(zero_copy_only=False).astype(bool)
    stats.rows += batch.num_rows
    stats.valid += int(valid.sum())
    if not valid.all():
        _count_invalid(stats, batch, valid)
    values = {c: _floats(batch.column(c)) for c in layout.numeric()}
    for column, moments in stats.moments.items():
        moments.add(values[column])
    for task, moments in stats.widths.items():
        moments.add(values[layout.upper[task]] - values[layout.lower[task]])
    if layout.in_domain:
        verdicts = batch.column(layout.in_domain)
        inside = int(pc.sum(pc.cast(verdicts, pa.int64())).as_py() or 0)
        stats.in_domain = (stats.in_domain[0] + inside, stats.in_domain[1] + len(verdicts) - verdicts.null_count)
    for task in layout.tasks:
        _keep_top(stats.top.setdefault(task, []), values[task], batch, first_row, top_n)


def _count_invalid(stats: LibraryStats, batch: pa.RecordBatch, valid: np.ndarray) -> None:
    errors = batch.column("error").filter(pa.array(~valid))
    kinds = pc.list_element(pc.split_pattern(pc.fill_null(errors, ""), ":", max_splits=1), 0)
    for entry in pc.value_counts(kinds).to_pylist():
        stats.reasons[entry["values"] or "(no reason)"] += entry["counts"]
    smiles = batch.column(stats.layout.smiles).filter(pa.array(~valid))
    for i, kind in enumerate(kinds.to_pylist()[:200]):  # a few examples per reason, from the first rows
        examples = stats.examples.setdefault(kind or "(no reason)", [])
        if len(examples) < EXAMPLES:
            examples.append(str(smiles[i].as_py()))


def _keep_top(heap: list[tuple[float, int, dict]], values: np.ndarray, batch: pa.RecordBatch, first_row: int,
              top_n: int) -> None:
    """Keep the ``top_n`` highest values seen (a min-heap; ties: the earlier row), with their rows."""
    finite = np.flatnonzero(np.isfinite(values))
    if finite.size > top_n:
        finite = finite[np.argpartition(-values[finite], top_n - 1)[:top_n]]
    rows = batch.take(pa.array(finite)).to_pylist() if finite.size else []
    for i, row in zip(finite, rows):
        item = (float(values[i]), -(first_row + int(i)), row)
        if len(heap) < top_n:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)


__all__ = ["BATCH_ROWS", "LibraryStats", "Moments", "OutputLayout", "batches", "header", "is_prediction_output",
           "library_stats", "output_layout"]
