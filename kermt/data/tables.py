"""Reading molecule tables (CSV, compressed CSV, Parquet, SMILES files): a SMILES column, targets, clear errors.

Upstream's contract is kept: the SMILES column is the first column unless named, every other column is a target
unless ``target_columns`` are given, and an empty cell is a missing label. Unlike upstream, a non-numeric label is
an error naming the file, row and column instead of a crash deep inside training. Formats: ``kermt.data.formats``
(a SMILES file has a SMILES and a name column, and no labels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import io
import itertools

import numpy as np
import pandas as pd
import pyarrow as pa

from kermt.data.formats import InputFormat, SmiLayout, input_format, row_place
from kermt.data.sniff import SAMPLE_ROWS, check_separator, check_smiles_column
from kermt.errors import UserError
from kermt.names import did_you_mean


@dataclass(frozen=True)
class MoleculeTable:
    """smiles [N]; targets float64 [N, T] with NaN for a missing label; rows are the file's data rows (0-based)."""

    path: str
    smiles: list[str]
    target_names: list[str]
    targets: np.ndarray
    extra_columns: dict[str, list]

    def __len__(self) -> int:
        return len(self.smiles)


def read_table(path: str | Path, max_rows: int | None = None) -> pd.DataFrame:
    """A data file by its name (see ``kermt.data.formats``); CSV and SMILES-file cells are read as text, so labels
    are parsed by us. A missing, unreadable or malformed file is a UserError naming it."""
    fmt = input_format(path)
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file not found: {path}" if not path.exists() else f"{path} is not a file")
    try:
        if fmt.kind == "parquet":
            frame = pd.read_parquet(path)
            return frame.head(max_rows) if max_rows is not None else frame
        with io.TextIOWrapper(pa.input_stream(str(path), compression=fmt.compression), encoding="utf-8-sig",
                              newline="") as handle:
            if fmt.kind == "smi":
                return _read_smi(handle, max_rows)
            return _read_csv(path, handle, max_rows)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, pa.ArrowException, OSError) as error:
        raise UserError(f"{path}: cannot read it as {_describe(fmt)} ({' '.join(str(error).split())})") from error


def _read_csv(path: Path, handle: io.TextIOBase, max_rows: int | None) -> pd.DataFrame:
    """Cells as text. The header is read as a row, not by pandas, which renames a repeated name (``y``, ``y.1``)
    and so would train a second task silently."""
    rows = pd.read_csv(handle, dtype=str, keep_default_na=False, header=None,
                       nrows=None if max_rows is None else max_rows + 1)
    header = [str(name) for name in rows.iloc[0]]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise UserError(f"{path}: column {repeated[0]!r} appears {header.count(repeated[0])} times in the header; "
                        "give each column its own name")
    check_separator(path, header, [str(cell) for cell in rows.iloc[1:11, 0]])
    frame = rows.iloc[1:].reset_index(drop=True)
    frame.columns = header
    return frame


def _describe(fmt: InputFormat) -> str:
    names = {"csv": "CSV", "parquet": "Parquet", "smi": "a SMILES file"}
    return names[fmt.kind] + (f" ({fmt.compression}-compressed)" if fmt.compression else "")


def _read_smi(handle: io.TextIOBase, max_rows: int | None) -> pd.DataFrame:
    first = handle.readline()
    layout = SmiLayout.from_first_line(first)
    lines = handle if layout.header else itertools.chain([first], handle)
    smiles, names = layout.parse(lines if max_rows is None else _first_data_lines(lines, max_rows))
    return pd.DataFrame({layout.columns[0]: smiles, layout.columns[1]: names}, dtype=str)


def _first_data_lines(lines, count: int) -> list[str]:
    kept = []
    for line in lines:
        if len(kept) == count:
            break
        if line.strip() and not line.lstrip().startswith("#"):
            kept.append(line)
    return kept


def load_molecule_table(
    path: str | Path,
    smiles_column: str | None = None,
    target_columns: Sequence[str] | None = None,
    keep_columns: Sequence[str] = (),
    require_targets: bool = True,
    max_rows: int | None = None,
) -> MoleculeTable:
    """Read ``path`` and parse its labels. ``keep_columns`` are carried through untouched (ids, names)."""
    frame = read_table(path, max_rows)
    if frame.shape[1] == 0:
        raise UserError(f"{path}: the file has no columns")
    named, smiles_column = smiles_column is not None, smiles_column or str(frame.columns[0])
    _require_columns(path, frame, [smiles_column, *keep_columns, *(target_columns or [])])
    first_rows = frame.head(SAMPLE_ROWS)  # a SMILES column with no SMILES: named before a label is parsed
    check_smiles_column(path, {str(c): first_rows[c] for c in frame.columns}, smiles_column, named)
    smi_file = input_format(path).kind == "smi"
    if target_columns is None:
        target_columns = [] if smi_file else [c for c in frame.columns if c != smiles_column and c not in keep_columns]
    if require_targets and not target_columns:
        what = "a SMILES file holds no labels; use a CSV or Parquet file with label columns" if smi_file else (
            f"the file has only {list(frame.columns)}")
        raise UserError(f"{path}: no target columns ({what})")
    smiles = ["" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v) for v in frame[smiles_column]]
    targets = np.stack([parse_labels(path, frame[c], c) for c in target_columns], axis=1) if target_columns else (
        np.zeros((len(frame), 0))
    )
    extra = {c: frame[c].tolist() for c in keep_columns}
    return MoleculeTable(str(path), smiles, list(target_columns), targets, extra)


def _require_columns(path: str | Path, frame: pd.DataFrame, columns: Sequence[str]) -> None:
    for column in columns:
        if column not in frame.columns:
            raise UserError(f"{path}: no column {column!r}{did_you_mean(column, frame.columns)}; columns are "
                            f"{list(frame.columns)}")


def parse_labels(path: str | Path, raw: pd.Series, column: str, first_row: int = 0) -> np.ndarray:
    """Float labels; '' / None / NaN are missing. Anything else non-numeric is an error naming its line
    (``first_row``: the data row of ``raw``'s first value, for a file read in blocks)."""
    if pd.api.types.is_numeric_dtype(raw):
        return raw.to_numpy(dtype=np.float64)
    text = raw.fillna("").astype(str).str.strip()
    values = pd.to_numeric(text.where(text != "", None), errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(np.isnan(values) & (text != "").to_numpy() & (text.str.lower() != "nan").to_numpy())
    if len(bad):
        at = int(bad[0])
        raise UserError(
            f"{path}: {row_place(path, first_row + at)}, column {column!r}: label {text.iloc[at]!r} is not a number. "
            "Leave the cell empty for a missing label, or choose the target columns with --target_columns."
        )
    return values


def infer_dataset_type(targets: np.ndarray) -> str:
    """classification when every present label is 0 or 1, else regression."""
    present = targets[~np.isnan(targets)]
    if present.size and np.isin(present, (0.0, 1.0)).all():
        return "classification"
    return "regression"


def check_classification_labels(path: str, targets: np.ndarray, target_names: Sequence[str],
                                first_row: int = 0) -> None:
    """Classification labels must be exactly 0 or 1 (upstream asserts this late; we say where)."""
    bad = np.argwhere(~np.isnan(targets) & ~np.isin(targets, (0.0, 1.0)))
    if len(bad):
        at, col = (int(i) for i in bad[0])
        raise UserError(
            f"{path}: {row_place(path, first_row + at)}, column {target_names[col]!r}: label {targets[at, col]:g} is "
            "not 0 or 1, but dataset_type is classification. Use --dataset_type regression or fix the label."
        )
