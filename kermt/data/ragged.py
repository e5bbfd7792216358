"""Ragged arrays (many molecules' rows concatenated, with offsets) and their Arrow list columns.

The featurised-molecule tables of Ray Data and the Parquet shards of a pretraining corpus both store per-molecule
rows this way; one definition keeps their layouts the same.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """int64 [n + 1]: molecule i owns rows ``offsets[i]:offsets[i + 1]`` when molecule i has ``counts[i]`` rows."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def list_column(values: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Arrow large_list column: row i holds ``values[offsets[i]:offsets[i+1]]``, rows of 2-d values flattened, in
    the values' own dtype."""
    width = int(np.prod(values.shape[1:], dtype=np.int64))
    flat = np.ascontiguousarray(values).reshape(-1)
    return pa.LargeListArray.from_arrays(pa.array(np.asarray(offsets, dtype=np.int64) * width), pa.array(flat))


def flat_values(table: pa.Table, name: str) -> np.ndarray:
    """The values of list column ``name``, concatenated over rows, in the column's own dtype (1-d)."""
    return pc.list_flatten(table.column(name).combine_chunks()).to_numpy(zero_copy_only=False)
