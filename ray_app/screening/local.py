"""Which engine streams a screening command, and the input read in this process for ``--engine local``.

Most predictions are small (a few to a few thousand molecules), where starting a local Ray cluster costs far more
than the work (docs/screening.md#engines). This path runs the very stages of the Ray stream
(:func:`ray_app.screening.stream.featurize_block`, then ``PredictStage`` / ``EmbedStage``) on the very blocks it
would see: the input is read with the same pyarrow options (:func:`ray_app.screening.files.csv_options`) and cut
into blocks of exactly ``rows_per_block(batch_size)`` rows, so the model meets the same batches (also with
``--upstream_batching``) and the output files are the same, byte for byte (tests/ray_app/screening/test_local.py).

Nothing here imports Ray: a small prediction costs the imports, the model load and the molecules.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from kermt.errors import UserError
from ray_app.common.storage import is_uri
from ray_app.screening.config import LOCAL_MAX_ROWS, EmbedConfig, FingerprintConfig, ModelScreeningConfig, log
from ray_app.screening.files import InputTable, csv_options, filesystem_of, row_estimate, split_smi_lines

StreamedConfig = ModelScreeningConfig | FingerprintConfig | EmbedConfig
# a compressed file's row count is not known without reading it: assume a row per this many compressed bytes (a
# compressed SMILES line is rarely shorter), so the guess errs towards Ray
COMPRESSED_BYTES_PER_ROW = 10
READ_BLOCK_BYTES = 1 << 20


def resolve_engine(config: StreamedConfig, paths: Sequence[str | None] = ()) -> StreamedConfig:
    """``config`` with ``engine`` "local" or "ray": the flag as given, or for ``auto`` the in-process path when no
    cluster is named or running, every input is a local file and the data has at most LOCAL_MAX_ROWS rows.
    ``paths``: other inputs the command streams (``--calibration_path``)."""
    if config.engine == "local":
        _check_local(config)
        return config
    if config.engine == "ray":
        return config
    why_ray = _why_ray(config, [config.data_path, *paths])
    engine = "ray" if why_ray else "local"
    log(f"engine: {engine} ({why_ray or 'a small local input, no cluster named or running'}; --engine "
        f"{'local' if why_ray else 'ray'} to choose the other)")
    return config.model_copy(update={"engine": engine})


def _check_local(config: StreamedConfig) -> None:
    for flag, value in (("--address", config.address), ("--concurrency", config.concurrency)):
        if value is not None:
            raise UserError(f"{flag} {value} is for --engine ray; --engine local computes in this process")


def _why_ray(config: StreamedConfig, paths: Sequence[str | None]) -> str | None:
    """Why ``auto`` streams on Ray (None: it runs in-process)."""
    if config.address or os.environ.get("RAY_ADDRESS"):
        return f"a cluster is named ({config.address or 'RAY_ADDRESS'})"
    if _ray_is_running_here():
        return "this process is connected to a Ray cluster"
    if config.concurrency is not None:
        return f"--concurrency {config.concurrency} asks for model actors"
    remote = [p for p in paths if p is not None and is_uri(p)]
    if remote:
        return f"{remote[0]} is read where it is, by Ray Data"
    rows = _rows_at_most(config.data_path)
    if rows > LOCAL_MAX_ROWS:
        return f"{config.data_path} has more than {LOCAL_MAX_ROWS:,} rows"
    return None


def _ray_is_running_here() -> bool:
    ray = sys.modules.get("ray")  # never imported for this: a process that has not imported Ray runs no cluster
    return ray is not None and ray.is_initialized()


def _rows_at_most(path: str) -> int:
    rows = row_estimate(path)
    if rows is not None:
        return rows
    return os.path.getsize(path) // COMPRESSED_BYTES_PER_ROW


def read_blocks(table: InputTable, columns: Sequence[str], block_rows: int) -> Iterator[pa.Table]:
    """``columns`` of the file (as Ray Data reads them: strings for CSV and SMILES files) in blocks of exactly
    ``block_rows`` rows, the last one shorter."""
    pending: list[pa.Table] = []
    held = 0
    for piece in _pieces(table, columns):
        pending.append(piece)
        held += piece.num_rows
        while held >= block_rows:
            joined = pa.concat_tables(pending)
            yield joined.slice(0, block_rows)
            pending, held = [joined.slice(block_rows)], held - block_rows
    if held:
        yield pa.concat_tables(pending)


def _pieces(table: InputTable, columns: Sequence[str]) -> Iterator[pa.Table]:
    """The file's rows as the reader hands them out (any sizes)."""
    filesystem, inner = filesystem_of(table.path)
    if table.format.kind == "parquet":
        with filesystem.open_input_file(inner) as handle:
            for batch in pq.ParquetFile(handle).iter_batches(columns=list(columns)):
                yield pa.Table.from_batches([batch])
        return
    options = csv_options(table, columns)
    read = options.pop("read_options", pa_csv.ReadOptions())
    read.block_size = READ_BLOCK_BYTES
    with filesystem.open_input_stream(inner, compression=table.format.compression) as handle:
        try:
            for batch in pa_csv.open_csv(handle, read_options=read, **options):
                piece = pa.Table.from_batches([batch])
                yield (split_smi_lines(piece, table.smi_layout, tuple(columns)) if table.smi_layout is not None
                       else piece)
        except pa.ArrowInvalid as error:
            raise malformed_csv(table.path) from error


def malformed_csv(path: str) -> UserError:
    return UserError(f"{path}: malformed CSV: a row has more or fewer fields than the header, or a quote is not "
                     "closed; fix the file")


def count_rows(table: InputTable, column: str) -> int:
    return sum(block.num_rows for block in _pieces(table, [column]))


__all__ = ["count_rows", "malformed_csv", "read_blocks", "resolve_engine"]
