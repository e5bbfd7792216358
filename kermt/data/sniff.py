"""Cheap looks at a data file's first rows that name a likely mistake before any work starts.

Two mistakes of a first hour: a ``.csv`` saved with ``;`` or tabs between its fields (read comma-separated it is one
column, ``smiles;SOL``), and a SMILES column that holds no SMILES (the SMILES are in another column, or the file
has none). Each check looks at the first rows only and refuses only what no run could use: a SMILES column none of
whose first :data:`SAMPLE_ROWS` filled cells parses (the first that does ends the look), a one-column file whose
header and first rows all hold the same other separator.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from kermt.errors import UserError

SAMPLE_ROWS = 1000  # cells of the SMILES column looked at; the first valid SMILES ends the look
HINT_ROWS = 50  # cells of each other column parsed when looking for the SMILES column the user likely meant
SEPARATORS = {";": "';'", "\t": "tab"}


def check_separator(path: str | Path, header: Sequence[str], first_cells: Sequence[str]) -> None:
    """A one-column CSV whose header and first data rows (``first_cells``: their one cell) all hold ``;`` or a tab
    was saved with that separator: a UserError that says so (read with commas it has one column)."""
    if len(header) != 1:
        return
    rows = [cell for cell in first_cells if cell]
    for separator, name in SEPARATORS.items():
        if separator in header[0] and all(separator in cell for cell in rows):
            raise UserError(f"{path}: looks {name}-separated (its header reads as the one column {header[0]!r}); a "
                            ".csv is read comma-separated: save it with commas")


def _filled(values: Iterable[object], count: int) -> list[str]:
    """The filled cells among the first ``count`` values, as text (a Parquet column may hold numbers or nulls)."""
    cells = (v.strip() if isinstance(v, str) else "" if v is None or (isinstance(v, float) and math.isnan(v))
             else str(v) for v in itertools.islice(values, count))
    return [cell for cell in cells if cell]


def _why_not(text: str) -> str | None:
    """Why ``text`` is no usable SMILES (RDKit's reason), or None when it is one."""
    from kermt.chem.validation import parse_smiles  # RDKit: imported when a file is read, not with the settings

    return parse_smiles(text)[1]


def _parses(text: str) -> bool:
    return _why_not(text) is None


def likely_smiles_column(columns: Mapping[str, Iterable[object]], besides: str) -> str | None:
    """The column other than ``besides`` whose first :data:`HINT_ROWS` filled cells parse as SMILES most often
    (at least half of them), or None."""
    shares = {}
    for name, values in columns.items():
        cells = _filled(values, HINT_ROWS)
        if name != besides and cells:
            shares[name] = sum(map(_parses, cells)) / len(cells)
    best = max(shares, key=shares.__getitem__, default=None)
    return best if best is not None and shares[best] >= 0.5 else None


def check_smiles_column(path: str | Path, columns: Mapping[str, Iterable[object]], smiles_column: str,
                        named: bool) -> None:
    """A UserError when none of the first :data:`SAMPLE_ROWS` filled cells of ``smiles_column`` (``named``: given
    by --smiles_column, else the first column) parses as a SMILES, naming the column that likely holds them.
    ``columns``: the first rows of the file, column by column."""
    cells = _filled(columns[smiles_column], SAMPLE_ROWS)
    if not cells or any(_parses(cell) for cell in cells):
        return
    likely = likely_smiles_column(columns, smiles_column)
    which = f"column {smiles_column!r}" if named else f"the first column, {smiles_column!r}, is read as SMILES but"
    example = f"{cells[0]!r}" if likely else f"{cells[0]!r}: {_why_not(cells[0])}"
    hint = f"did you mean `--smiles_column {likely}`?" if likely else (
        "fix them, or name the SMILES column with --smiles_column")
    raise UserError(f"{path}: {which} holds no valid SMILES in its first {len(cells)} filled rows (e.g. {example}); "
                    f"{hint}")


__all__ = ["HINT_ROWS", "SAMPLE_ROWS", "check_separator", "check_smiles_column", "likely_smiles_column"]
