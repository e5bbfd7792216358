"""A screening input's first rows, read on the driver before Ray starts to name a likely mistake
(:mod:`kermt.data.sniff`): a ``.csv`` saved with ``;`` or tabs, a SMILES column that holds no SMILES.

Only the first :data:`~kermt.data.sniff.SAMPLE_ROWS` rows are read (of a Parquet file: its text columns, where
SMILES can be). A file these rows cannot be read from is left to the stream, which names the problem.
"""

from __future__ import annotations

import csv
import io
import itertools

import pyarrow as pa
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from kermt.data.sniff import SAMPLE_ROWS, check_separator, check_smiles_column
from ray_app.screening.files import InputTable


def check_first_rows(table: InputTable, smiles_column: str | None) -> None:
    """UserError for a one-column CSV that looks ';'- or tab-separated, and for a SMILES column (``smiles_column``,
    else the first) with no valid SMILES in its first rows, naming the column that likely holds them. A column
    that is not in the file is left to :func:`~ray_app.screening.files.pick_columns`."""
    try:
        columns = first_rows(table, SAMPLE_ROWS)
    except (OSError, UnicodeDecodeError, csv.Error, pa.ArrowException):
        return
    if table.format.kind == "csv":
        check_separator(table.path, table.columns, columns.get(table.columns[0], []))
    smiles = smiles_column or table.columns[0]
    if smiles in columns:
        check_smiles_column(table.path, columns, smiles, named=smiles_column is not None)


def first_rows(table: InputTable, count: int) -> dict[str, list]:
    """The first ``count`` data rows, column by column (a Parquet file's text columns only)."""
    path = table.path
    filesystem, inner = pa_fs.FileSystem.from_uri(path) if "://" in path else (pa_fs.LocalFileSystem(), path)
    if table.format.kind == "parquet":
        with filesystem.open_input_file(inner) as handle:
            parquet = pq.ParquetFile(handle)
            text = [f.name for f in parquet.schema_arrow if pa.types.is_string(f.type)
                    or pa.types.is_large_string(f.type)]
            batch = next(parquet.iter_batches(batch_size=count, columns=text), None) if text else None
        return batch.to_pydict() if batch is not None else {}
    with filesystem.open_input_stream(inner, compression=table.format.compression) as raw, \
            io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
        lines = list(itertools.islice(text, count + 1))
    if table.smi_layout is not None:
        parsed = table.smi_layout.parse(lines[int(table.smi_layout.header):])
        return dict(zip(table.smi_layout.columns, parsed))
    rows = list(csv.reader(lines))[1:]
    return {name: [row[i] if i < len(row) else "" for row in rows] for i, name in enumerate(table.columns)}


__all__ = ["check_first_rows", "first_rows"]
