"""The screening stream in this process, without Ray (``--engine local``; :mod:`ray_app.screening.engines` decides).

Most predictions are small (a few to a few thousand molecules), where starting a local Ray cluster costs far more
than the work (docs/screening.md#engines). This path runs the very stages of the Ray stream
(:func:`ray_app.screening.stream.featurize_block`, then ``PredictStage`` / ``EmbedStage``) on the very blocks it
would see: the input is read with the same pyarrow options (:func:`ray_app.screening.files.csv_options`) and cut
into blocks of exactly ``rows_per_block(batch_size)`` rows, so the model meets the same batches (also with
``--upstream_batching``) and the output files are the same, byte for byte (tests/ray_app/screening/test_local.py).

Nothing here imports Ray: a small prediction costs the imports, the model load and the molecules.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from ray_app.common.torch_threads import torch_threads
from ray_app.screening.files import InputTable, csv_options, filesystem_of, malformed_csv, split_smi_lines
from ray_app.screening.stream import InputSpec, featurize_block, file_feature_columns, rows_per_block

READ_BLOCK_BYTES = 1 << 20


def local_stream(table: InputTable, spec: InputSpec, batch_size: int, stage: type, stage_kwargs: dict,
                 file_features: tuple[np.ndarray, np.ndarray] | None = None, threads: int = 1) -> Iterator[pa.Table]:
    """build_stream's blocks, computed in this process: the same stages on the same blocks of rows (module
    docstring of :mod:`ray_app.screening.local`), the model on ``threads`` threads as an actor of that many CPUs.

    Why not torch's default (every core): OpenMP's threads spin while they wait, so on a busy machine two of them
    made a 2,000-molecule prediction 2-7x slower than one (bench/predict.py, docs/screening.md#engines)."""
    with torch_threads(threads):
        model = stage(**stage_kwargs)
        start = 0
        for block in read_blocks(table, spec.read_columns, rows_per_block(batch_size)):
            if file_features is not None:
                rows = slice(start, start + block.num_rows)
                for name, column in file_feature_columns(file_features[0][rows], file_features[1][rows]).items():
                    block = block.append_column(name, column)
            start += block.num_rows
            yield model(featurize_block(block, spec))


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


def count_rows(table: InputTable, column: str) -> int:
    return sum(block.num_rows for block in _pieces(table, [column]))


__all__ = ["count_rows", "local_stream", "read_blocks", "torch_threads"]
