"""Input and output files of the screening commands, read and written in a stream (memory flat in the row count).

Inputs: a CSV or Parquet file (or URI) read lazily by Ray Data; only the SMILES and id columns are read, all as
strings (per-block type inference could otherwise disagree between blocks, e.g. an id column that looks numeric).

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
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from ray_app.config import did_you_mean

TABLE_SUFFIXES = (".csv", ".parquet")


def input_format(path: str) -> str:
    suffix = Path(path.split("?")[0]).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"data_path {path!r}: expected a .csv or .parquet file")
    return suffix[1:]


def column_names(path: str) -> list[str]:
    """Header of a CSV / schema names of a Parquet file, local path or URI (only the first bytes are read)."""
    filesystem, inner = pa_fs.FileSystem.from_uri(path) if "://" in path else (pa_fs.LocalFileSystem(), path)
    if filesystem.get_file_info(inner).type != pa_fs.FileType.File:
        raise FileNotFoundError(f"data_path {path} does not exist or is not a file")
    if input_format(path) == "parquet":
        with filesystem.open_input_file(inner) as handle:
            return list(pq.read_schema(handle).names)
    with filesystem.open_input_stream(inner) as handle:
        first = io.TextIOWrapper(handle, encoding="utf-8-sig", newline="").readline()
    header = next(csv.reader([first]), [])
    if not header:
        raise ValueError(f"data_path {path} is empty (no header line)")
    return header


def pick_columns(names: Sequence[str], smiles_column: str | None, id_columns: Sequence[str]) -> str:
    """The SMILES column (default: the first one, as upstream); every named column must exist."""
    smiles = smiles_column or names[0]
    for name in [smiles, *id_columns]:
        if name not in names:
            raise ValueError(f"column {name!r} is not in the data (columns: {', '.join(names)})"
                             f"{did_you_mean(name, names)}")
    return smiles


def read_table_lazily(path: str, columns: Sequence[str]):
    """A lazy Ray Dataset of ``columns`` (strings) of a CSV or Parquet file."""
    import ray

    if input_format(path) == "parquet":
        return ray.data.read_parquet(path, columns=list(columns))
    options = pa_csv.ConvertOptions(include_columns=list(columns), column_types={c: pa.string() for c in columns},
                                    strings_can_be_null=True)
    return ray.data.read_csv(path, convert_options=options)


def _staging(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.partial")


class TableWriter:
    """Appends pyarrow tables (one schema) to a CSV or Parquet file, chosen by the suffix of ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.format = self.path.suffix.lower()[1:]
        if f".{self.format}" not in TABLE_SUFFIXES:
            raise ValueError(f"output_path {path}: expected a .csv or .parquet file")
        self.staging = _staging(self.path)
        self._writer = None

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            if self.format == "csv":
                options = pa_csv.WriteOptions(quoting_style="needed")
                self._writer = pa_csv.CSVWriter(str(self.staging), table.schema, write_options=options)
            else:
                self._writer = pq.ParquetWriter(str(self.staging), table.schema)
        self._writer.write_table(table)

    def commit(self) -> None:
        if self._writer is not None:
            self._writer.close()
        os.replace(self.staging, self.path)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
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
    "ArraySpool", "JsonListSpool", "TableWriter", "column_names", "input_format", "pick_columns",
    "read_table_lazily", "write_metadata_json", "write_npy", "write_npz",
]
