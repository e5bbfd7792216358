"""The objectives that score in this process: ``lookup:`` (a file of known scores) and ``python:`` (a function).

A scorer takes a batch of SMILES and returns :class:`Scores`: one float per molecule (NaN where it has none) and
one error text per molecule ("" where scored). A molecule without a score is recorded with its reason, never
fatal; the round goes on with the others. ``command:`` runs on the cluster (``ray_app.explore``).
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kermt.errors import UserError
from kermt.explore.objective_spec import ObjectiveSpec
from kermt.names import did_you_mean

NOT_IN_LOOKUP = "no score in the lookup file"


@dataclass(frozen=True)
class Scores:
    """``values`` float64 [n] (NaN: not scored), ``errors`` [n] ("" where scored)."""

    values: np.ndarray
    errors: list[str]

    @property
    def failed(self) -> int:
        return sum(1 for e in self.errors if e)


@dataclass(frozen=True)
class LookupScorer:
    """Scores read from ``path``'s ``column``, matched on the SMILES exactly as the library writes them."""

    path: str
    smiles_column: str
    column: str

    def __call__(self, smiles: Sequence[str]) -> Scores:
        import pyarrow as pa
        import pyarrow.compute as pc

        table = _read(self.path, (self.smiles_column, self.column))
        asked = pa.array(list(smiles), pa.string())
        known = self._first_scores(table.filter(pc.is_in(table.column(self.smiles_column), value_set=asked)), {})
        values = np.array([known.get(s, math.nan) for s in smiles], dtype=np.float64)
        errors = ["" if math.isfinite(v) else NOT_IN_LOOKUP if s not in known else "its lookup score is not a number"
                  for s, v in zip(smiles, values)]
        return Scores(values, errors)

    def known_scores(self) -> dict[str, float]:
        """Every SMILES of the file with its score, as a call gives it (NaN: a cell that is not a number), read one
        block of the file at a time: what scoring a whole library in blocks looks up (a call per block would read
        the file again for each)."""
        import pyarrow as pa

        known: dict[str, float] = {}
        for batch in _read_batches(self.path, (self.smiles_column, self.column)):
            self._first_scores(pa.Table.from_batches([batch]), known)
        return known

    def _first_scores(self, table, known: dict[str, float]) -> dict[str, float]:
        """``known`` with ``table``'s rows added in order: a SMILES keeps the first row whose cell is not empty."""
        for key, value in zip(table.column(self.smiles_column).to_pylist(), table.column(self.column).to_pylist()):
            if key not in known and value not in (None, ""):  # an empty cell is no score; the first of two rows
                known[key] = _number(value)
        return known


def lookup_scorer(spec: ObjectiveSpec) -> LookupScorer:
    """The lookup scorer of ``spec``, its file's header checked now: a one-line error before any work."""
    assert spec.kind == "lookup" and spec.path is not None
    names = _read(spec.path, None, header_only=True).names
    smiles = next((n for n in names if n.lower() == "smiles"), names[0])
    others = [n for n in names if n != smiles]
    column = spec.column or (others[0] if others else None)
    if column is None:
        raise UserError(f"--objective {spec.text}: {spec.path} has no score column beside {smiles!r}")
    if column not in names:
        raise UserError(f"--objective {spec.text}: {spec.path} has no column {column!r}"
                        f"{did_you_mean(column, names)}; its columns: {', '.join(names)}")
    return LookupScorer(spec.path, smiles, column)


def _read(path: str, columns: tuple[str, ...] | None, header_only: bool = False):
    import pyarrow.csv as pacsv

    with _reading(path):
        if header_only:
            with pacsv.open_csv(path, convert_options=_as_strings(columns)) as reader:
                return reader.schema
        return pacsv.read_csv(path, convert_options=_as_strings(columns))


def _read_batches(path: str, columns: tuple[str, ...]) -> Iterator:
    """``path``'s ``columns`` as strings, one record batch at a time (pyarrow's streaming CSV reader)."""
    import pyarrow.csv as pacsv

    with _reading(path), pacsv.open_csv(path, convert_options=_as_strings(columns)) as reader:
        yield from reader


def _as_strings(columns: tuple[str, ...] | None):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    return pacsv.ConvertOptions(column_types={c: pa.string() for c in columns or ()},
                                include_columns=list(columns) if columns else None)


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """A missing or malformed lookup file as a one-line error."""
    import pyarrow as pa

    try:
        yield
    except FileNotFoundError:
        raise UserError(f"--objective lookup:{path}: the file does not exist") from None
    except pa.ArrowInvalid as error:
        raise UserError(f"--objective lookup:{path}: cannot read it as CSV ({' '.join(str(error).split())})") from None


def _number(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def python_scorer(spec: ObjectiveSpec) -> Callable[[Sequence[str]], Scores]:
    """The function ``spec`` names, imported now (a one-line error when it cannot be), wrapped to give Scores."""
    assert spec.kind == "python" and spec.module and spec.function
    try:
        module = importlib.import_module(spec.module)
    except ImportError as error:
        raise UserError(f"--objective {spec.text}: cannot import {spec.module} ({error})") from None
    function = getattr(module, spec.function, None)
    if not callable(function):
        raise UserError(f"--objective {spec.text}: {spec.module} has no function {spec.function}")

    def score(smiles: Sequence[str]) -> Scores:
        returned = list(function(list(smiles)))
        if len(returned) != len(smiles):
            raise UserError(f"--objective {spec.text} returned {len(returned)} scores for {len(smiles)} SMILES; it "
                            "must return one per SMILES, in order (None where it has none)")
        values = np.array([_number(None if v is None else str(v)) for v in returned], dtype=np.float64)
        return Scores(values, ["" if math.isfinite(v) else f"{spec.function} gave no score" for v in values])

    return score


__all__ = ["LookupScorer", "NOT_IN_LOOKUP", "Scores", "lookup_scorer", "python_scorer"]
