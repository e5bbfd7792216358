"""Input and output files of the screening commands, read and written in a stream (memory flat in the row count).

Inputs: a CSV (plain or compressed), Parquet or SMILES file (or URI; formats: ``kermt.data.formats``) read lazily by
Ray Data; only the SMILES and id columns are read, all as strings (per-block type inference could otherwise
disagree between blocks, e.g. an id column that looks numeric). A SMILES file is read as one text column of lines
(compressed or not, by the same reader) that CPU tasks split into the SMILES and name columns.

Outputs are written by the driver as blocks arrive, in input order, into a hidden staging file next to the target
that is renamed into place at the end, so a failed run never leaves a truncated file behind:

* tables (predictions, Parquet embeddings): CSV or Parquet by suffix, one block appended at a time;
* arrays (fingerprints ``.npz`` key ``fps``, ``.npy`` embeddings): rows are spooled to a raw temporary file and
  copied behind the ``.npy`` header once the row count is known.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from kermt.data.formats import InputFormat, SmiLayout, input_format
from kermt.errors import UserError
from ray_app.common.settings import did_you_mean

TABLE_SUFFIXES = (".csv", ".parquet")
LINE_COLUMN = "line"
NO_DELIMITER = "\x1f"  # ASCII unit separator: never in a SMILES file, so each line is one CSV field


def filesystem_of(path: str) -> tuple[pa_fs.FileSystem, str]:
    """The filesystem holding the file ``path`` (local path or URI) and its path there; an error if it is none."""
    filesystem, inner = pa_fs.FileSystem.from_uri(path) if "://" in path else (pa_fs.LocalFileSystem(), path)
    if filesystem.get_file_info(inner).type != pa_fs.FileType.File:
        raise UserError(f"data_path {path} does not exist or is not a file")
    return filesystem, inner


def _first_line(path: str) -> str:
    filesystem, inner = filesystem_of(path)
    try:
        with filesystem.open_input_stream(inner, compression=input_format(path).compression) as handle:
            return io.TextIOWrapper(handle, encoding="utf-8-sig", newline="").readline()
    except (OSError, UnicodeDecodeError, pa.ArrowException) as error:
        raise UserError(f"data_path {path}: cannot read its first line ({' '.join(str(error).split())})") from error


def row_estimate(path: str) -> int | None:
    """About how many data rows ``path`` holds, when that is cheap to know (for progress lines, never for results):
    a Parquet file's metadata, local or URI; the line count of a local uncompressed text file (a quoted field
    spanning lines makes it a little high). None otherwise."""
    fmt = input_format(path)
    try:
        if fmt.kind == "parquet":
            filesystem, inner = filesystem_of(path)
            with filesystem.open_input_file(inner) as handle:
                return pq.ParquetFile(handle).metadata.num_rows
        if fmt.compression is None and "://" not in path:
            with open(path, "rb") as handle:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 24), b""))
            header = fmt.kind != "smi" or SmiLayout.from_first_line(_first_line(path)).header
            return max(0, lines - int(header))
    except (OSError, pa.ArrowException, UserError):
        return None
    return None


def _untextual(field: pa.Field) -> bool:
    """A column with no text form to carry into a prediction file (a stored fingerprint, an image)."""
    kind = field.type
    return (pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
            or pa.types.is_fixed_size_binary(kind))


@dataclass(frozen=True)
class InputTable:
    """An input file as the screening commands plan it, its header read once (a CSV's first line, a Parquet file's
    schema, a SMILES file's first line): its format, its columns, those with no text form (a Parquet file's nested
    or binary columns; CSV and SMILES files have none) and a SMILES file's layout. Local path or URI."""

    path: str
    format: InputFormat
    columns: tuple[str, ...]
    untextual: tuple[str, ...] = ()
    smi_layout: SmiLayout | None = None

    @classmethod
    def open(cls, path: str) -> InputTable:
        fmt = input_format(path)
        if fmt.kind == "parquet":
            filesystem, inner = filesystem_of(path)
            try:
                with filesystem.open_input_file(inner) as handle:
                    schema = pq.read_schema(handle)
            except pa.ArrowException as error:
                raise UserError(f"data_path {path}: not a Parquet file ({error})") from error
            return cls(path, fmt, tuple(schema.names), tuple(f.name for f in schema if _untextual(f)))
        first = _first_line(path)
        if fmt.kind == "smi":
            layout = SmiLayout.from_first_line(first)
            return cls(path, fmt, tuple(layout.columns), smi_layout=layout)
        header = next(csv.reader([first]), [])
        if not header:
            raise UserError(f"data_path {path} is empty (no header line)")
        return cls(path, fmt, tuple(header))

    @property
    def default_id_columns(self) -> tuple[str, ...]:
        """The name column of a SMILES file (written back next to the predictions); none for other formats."""
        return (self.columns[1],) if self.smi_layout is not None else ()


@dataclass(frozen=True)
class Source:
    """The input as the pipeline reads it: the file, its SMILES column and the id columns carried to the output."""

    table: InputTable
    smiles_column: str
    id_columns: tuple[str, ...]


def malformed_csv(path: str) -> UserError:
    """A CSV that pyarrow (here or in a Ray read task) could not split into the header's fields."""
    return UserError(f"{path}: malformed CSV: a row has more or fewer fields than the header, or a quote is not "
                     "closed; fix the file")


def pick_columns(names: Sequence[str], smiles_column: str | None, id_columns: Sequence[str]) -> str:
    """The SMILES column (default: the first one, as upstream); every named column must exist."""
    smiles = smiles_column or names[0]
    for name in [smiles, *id_columns]:
        if name not in names:
            raise UserError(f"column {name!r} is not in the data (columns: {', '.join(names)})"
                            f"{did_you_mean(name, names)}")
    return smiles


def readable_everywhere(path: str) -> tuple[str, dict]:
    """(path for Ray Data, read-task options). A local file on a multi-node cluster is only on the driver's node:
    its read tasks are pinned there (``local://``) and need no CPU (the head has none); what they read streams to
    featurisation tasks on the other nodes. URIs are read by tasks anywhere."""
    from ray_app.common.cluster import ClusterLayout
    from ray_app.common.storage import is_uri

    if is_uri(path) or not ClusterLayout.current().multi_node:
        return path, {}
    return f"local://{Path(path).resolve()}", {"num_cpus": 0}


def csv_options(table: InputTable, columns: Sequence[str]) -> dict:
    """pyarrow's CSV options for reading ``columns`` (as strings) of a CSV or SMILES file; Ray Data's reader and
    the in-process one (:mod:`ray_app.screening.local`) take the same, so both read the same values."""
    if table.smi_layout is not None:  # one text column of whole lines, split by split_smi_lines
        return {"read_options": pa_csv.ReadOptions(column_names=[LINE_COLUMN], skip_rows=int(table.smi_layout.header)),
                "parse_options": pa_csv.ParseOptions(delimiter=NO_DELIMITER, quote_char=False),
                "convert_options": pa_csv.ConvertOptions(column_types={LINE_COLUMN: pa.string()})}
    return {"convert_options": pa_csv.ConvertOptions(include_columns=list(columns), strings_can_be_null=True,
                                                     column_types={c: pa.string() for c in columns})}


def read_table_lazily(table: InputTable, columns: Sequence[str]):
    """A lazy Ray Dataset of ``columns`` (strings) of a CSV, Parquet or SMILES file."""
    import ray

    source, remote_args = readable_everywhere(table.path)
    compression = {"compression": table.format.compression}
    if table.format.kind == "parquet":
        # select_columns after the read: Ray pushes the projection into the Parquet reader
        return ray.data.read_parquet(source, ray_remote_args=remote_args).select_columns(list(columns))
    ds = ray.data.read_csv(source, file_extensions=None, ray_remote_args=remote_args,
                           arrow_open_stream_args=compression, **csv_options(table, columns))
    if table.smi_layout is not None:
        return ds.map_batches(split_smi_lines, fn_kwargs={"layout": table.smi_layout, "columns": tuple(columns)},
                              batch_format="pyarrow", batch_size=None)
    return ds


def split_smi_lines(batch: pa.Table, layout: SmiLayout, columns: Sequence[str]) -> pa.Table:
    """map_batches function: lines of a SMILES file -> its ``columns`` (of the layout's two), as strings."""
    lines = [line or "" for line in batch.column(LINE_COLUMN).to_pylist()]
    parsed = dict(zip(layout.columns, layout.parse(lines)))
    return pa.table({name: pa.array(parsed[name], pa.string()) for name in columns})


def _staging(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.partial")


# A Parquet output's row groups: blocks are buffered up to this many rows or bytes, whichever comes first. A row
# group per block (1,024 rows) left a footer of 3.3 MB per 10^7 rows, which every reader holds while the file is
# open (`kermt explore` reads a round's predictions of its whole library); the bytes bound keeps wide rows (`kermt
# embed`'s embeddings) from holding tens of thousands of rows in memory.
ROW_GROUP_ROWS = 65_536
ROW_GROUP_BYTES = 64 * 2**20


class TableWriter:
    """Appends pyarrow tables (one schema) to a CSV or Parquet file, chosen by the suffix of ``path``; a Parquet
    file gets row groups of up to ROW_GROUP_ROWS rows or ROW_GROUP_BYTES, whatever the tables' sizes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.format = self.path.suffix.lower()[1:]
        if f".{self.format}" not in TABLE_SUFFIXES:
            raise UserError(f"output_path {path}: expected a .csv or .parquet file")
        self.staging = _staging(self.path)
        self._writer = None
        self._buffered: list[pa.Table] = []

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            if self.format == "csv":
                options = pa_csv.WriteOptions(quoting_style="needed")
                self._writer = pa_csv.CSVWriter(str(self.staging), table.schema, write_options=options)
            else:
                self._writer = pq.ParquetWriter(str(self.staging), table.schema)
        if self.format == "csv":
            self._writer.write_table(table)
            return
        self._buffered.append(table)
        if (sum(t.num_rows for t in self._buffered) >= ROW_GROUP_ROWS
                or sum(t.nbytes for t in self._buffered) >= ROW_GROUP_BYTES):
            self._flush()

    def _flush(self) -> None:
        """The buffered tables as row groups of at most ROW_GROUP_ROWS rows (one, unless a table brought more)."""
        if self._buffered:
            self._writer.write_table(pa.concat_tables(self._buffered), row_group_size=ROW_GROUP_ROWS)
            self._buffered = []

    def commit(self) -> None:
        if self._writer is not None:
            self._flush()
            self._writer.close()
        os.replace(self.staging, self.path)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._buffered = []
        self.staging.unlink(missing_ok=True)


class ArraySpool:
    """Rows of a 2-D array of fixed width, appended in order to a temporary raw file (float32 unless told)."""

    def __init__(self, width: int, dtype: np.dtype = np.float32, directory: Path | None = None) -> None:
        self.width, self.dtype, self.rows = width, np.dtype(dtype), 0
        self._file = tempfile.TemporaryFile(dir=directory)

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1, self.width)
        self._file.write(values.tobytes())
        self.rows += values.shape[0]

    def write_npy(self, handle) -> None:
        """Write a complete ``.npy`` (header, then the spooled rows) to an open binary handle."""
        shape = (self.rows, self.width) if self.width != 1 else (self.rows,)
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(handle, header)
        self._file.seek(0)
        shutil.copyfileobj(self._file, handle, length=16 * 2**20)

    def close(self) -> None:
        self._file.close()


def write_npz(path: str | Path, spools: dict[str, ArraySpool]) -> None:
    """A compressed ``.npz`` (like ``np.savez_compressed``) of the spools, written atomically."""
    path = Path(path)
    staging = _staging(path)
    with zipfile.ZipFile(staging, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        for name, spool in spools.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                spool.write_npy(member)
    os.replace(staging, path)


def write_npy(path: Path, spool: ArraySpool) -> None:
    staging = _staging(path)
    with open(staging, "wb") as handle:
        spool.write_npy(handle)
    os.replace(staging, path)


class JsonListSpool:
    """A list of JSON values spooled to a temporary file, one per line; ``dump`` writes them as a JSON array."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(mode="w+", encoding="utf-8")

    def extend(self, values: Sequence) -> None:
        self._file.writelines(json.dumps(v) + "\n" for v in values)

    def dump(self, handle) -> None:
        self._file.seek(0)
        handle.write("[")
        for i, line in enumerate(self._file):
            handle.write(("," if i else "") + line.rstrip("\n"))
        handle.write("]")


def write_metadata_json(path: Path, header: dict, lists: dict[str, JsonListSpool]) -> None:
    """``{**header, name: [...], ...}`` written without holding the lists in memory."""
    staging = _staging(path)
    with open(staging, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(header)[:-1])
        for name, spool in lists.items():
            handle.write(f", {json.dumps(name)}: ")
            spool.dump(handle)
        handle.write("}\n")
    os.replace(staging, path)


__all__ = [
    "ArraySpool", "InputTable", "JsonListSpool", "Source", "TableWriter", "csv_options", "filesystem_of",
    "malformed_csv",
    "pick_columns", "read_table_lazily", "row_estimate", "split_smi_lines", "write_metadata_json", "write_npy",
    "write_npz",
]
