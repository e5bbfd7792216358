"""Reading corpus inputs with Ray Data, every row numbered: CSV (plain or compressed), Parquet and SMILES files,
local paths or URIs.

Ray Data's own readers lose the row number (a file is split into blocks that travel independently), and the
invalid-row report must name it. So each file is read by one Ray Data task that streams it (pyarrow's streaming
CSV reader, Parquet row-group batches, SMILES-file lines) and emits chunks of ``(source, row, raw)``: ``source``
the file's index in ``--data_path``, ``row`` its 0-based data row (header excluded, blank lines skipped, as
``kermt.data.tables`` counts them). The chunks are cleaned by the next stage's tasks in parallel, so a single huge
file (a compressed CSV cannot be split anyway) is read by one task but processed by all CPUs.

On a multi-node cluster a local file is on the driver's machine only: its read task is pinned to the driver's node.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from kermt.data.atomic_files import filesystem
from kermt.data.formats import SmiLayout, input_format, row_place
from kermt.errors import UserError
from ray_app.common.settings import did_you_mean

READ_CHUNK_ROWS = 8192
RAW_SCHEMA = pa.schema([("source", pa.int32()), ("row", pa.int64()), ("raw", pa.string())])


def check_corpus_files(paths: Sequence[str], smiles_column: str | None) -> list[str]:
    """Before Ray starts: every file exists, has a known format and the SMILES column (default: its first column).
    Returns the SMILES column of each file."""
    columns = []
    for path in paths:
        input_format(path)  # UserError for an unknown suffix
        fs, inner = filesystem(path)
        if fs.get_file_info(inner).type.name != "File":
            raise UserError(f"--data_path {path} does not exist or is not a file")
        names = _column_names(path)
        column = smiles_column or names[0]
        if column not in names:
            raise UserError(f"--data_path {path}: no column {column!r}{did_you_mean(column, names)} "
                            f"(columns: {', '.join(names)}); choose one with --smiles_column")
        columns.append(column)
    return columns


def _column_names(path: str) -> list[str]:
    """Column names from the header / Parquet schema / SMILES-file layout (only the file's start is read)."""
    fs, inner = filesystem(path)
    fmt = input_format(path)
    try:
        if fmt.kind == "parquet":
            with fs.open_input_file(inner) as handle:
                return list(pq.read_schema(handle).names)
        with fs.open_input_stream(inner, compression=fmt.compression) as stream:
            if fmt.kind == "smi":
                first = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="").readline()
                return list(SmiLayout.from_first_line(first).columns)
            return list(pa_csv.open_csv(stream).schema.names)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as error:
        raise UserError(f"--data_path {path}: cannot read it as {fmt.kind} "
                        f"({' '.join(str(error).split())[:300]})") from error


def _chunk(source: int, first_row: int, raw: pa.Array) -> pa.Table:
    rows = np.arange(first_row, first_row + len(raw), dtype=np.int64)
    return pa.table([pa.array(np.full(len(raw), source, np.int32)), pa.array(rows), raw.cast(pa.string())],
                     schema=RAW_SCHEMA)


def _csv_chunks(path: str, column: str) -> Iterator[pa.Array]:
    fs, inner = filesystem(path)
    stream = fs.open_input_stream(inner, compression=input_format(path).compression)
    convert = pa_csv.ConvertOptions(include_columns=[column], column_types={column: pa.string()},
                                    strings_can_be_null=False)
    reader = pa_csv.open_csv(stream, read_options=pa_csv.ReadOptions(block_size=1 << 22), convert_options=convert)
    for batch in reader:
        yield batch.column(0)


def _parquet_chunks(path: str, column: str) -> Iterator[pa.Array]:
    fs, inner = filesystem(path)
    with fs.open_input_file(inner) as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=READ_CHUNK_ROWS, columns=[column]):
            yield batch.column(0)


def _smi_chunks(path: str, column: str) -> Iterator[pa.Array]:
    fs, inner = filesystem(path)
    with fs.open_input_stream(inner, compression=input_format(path).compression) as stream:
        text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
        first = text.readline()
        layout = SmiLayout.from_first_line(first)
        lines = [] if layout.header else [first]
        for line in text:
            lines.append(line)
            if len(lines) == READ_CHUNK_ROWS:
                yield pa.array(layout.parse(lines)[0], pa.string())
                lines = []
        yield pa.array(layout.parse(lines)[0], pa.string())


_READERS = {"csv": _csv_chunks, "parquet": _parquet_chunks, "smi": _smi_chunks}


def read_file(source: int, path: str, column: str) -> Iterator[pa.Table]:
    """Chunks ``(source, row, raw)`` of one file, in file order."""
    row = 0
    try:
        for raw in _READERS[input_format(path).kind](path, column):
            for start in range(0, len(raw), READ_CHUNK_ROWS):
                part = raw.slice(start, READ_CHUNK_ROWS)
                yield _chunk(source, row, part)
                row += len(part)
    except (pa.ArrowInvalid, UnicodeDecodeError) as error:
        after = f" after {row_place(path, row - 1)}" if row else ""  # the last row read whole
        raise UserError(f"--data_path {path}: cannot read it{after} "
                        f"({' '.join(str(error).split())[:300]})") from error


def read_files(batch: pa.Table) -> Iterator[pa.Table]:
    """map_batches generator: one row (source, path, column) per file -> its chunks."""
    for source, path, column in zip(*(batch.column(name).to_pylist() for name in ("source", "path", "column"))):
        yield from read_file(source, path, column)


def read_remote_args(paths: Sequence[str]) -> dict:
    """Ray options of the read tasks: pinned to the driver's node when a local file must be read there
    (ray_app.common.node_reads.reading_node, the rule a worker's shard reads follow too)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ray_app.common.node_reads import reading_node

    node = reading_node(paths)
    if node is None:
        return {}
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def read_inputs(paths: Sequence[str], columns: Sequence[str]):
    """Lazy Ray Dataset of ``(source, row, raw)`` over all files, in file then row order (preserve_order is on)."""
    import ray

    files = pa.table({"source": pa.array(range(len(paths)), pa.int32()), "path": list(paths), "column": list(columns)})
    ds = ray.data.from_arrow(files).repartition(len(paths))  # one file per read task
    return ds.map_batches(read_files, batch_format="pyarrow", batch_size=1, **read_remote_args(paths))


__all__ = ["RAW_SCHEMA", "check_corpus_files", "read_file", "read_inputs", "read_remote_args"]
