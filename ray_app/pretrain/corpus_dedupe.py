"""Duplicate molecules of a `kermt corpus` run, found across all blocks of the cleaned inputs.

Two copies of a molecule (same canonical SMILES, ``kermt.data.corpus_prep.duplicate_keys``) may lie in different
files or blocks, read and cleaned by different tasks, so no block can decide alone. A hash partition decides per
molecule, as a map and a reduce over Ray tasks:

    each cleaned block -> (key, id) of its valid rows, split into B buckets by a hash of the key   (B outputs a task)
    each bucket        -> the ids of every copy but the first (smallest id: input order)           (one task a bucket)
    every block        -> a ``duplicate`` column: its id is among those                             (one task a block)

``id`` = source index << 40 | data row, so "first" is the first in input order, whatever the blocks, and the corpus
equals the in-process build's (``prepare_corpus``). The driver holds block references only; the ids of the
dropped copies (8 bytes each) travel between tasks through the object store.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kermt.data.corpus_prep import duplicate_keys

ROW_BITS = 40  # a data row number fits in 40 bits (10^12 rows per file); the source index takes the rest
MAX_BUCKETS = 64  # reduce tasks: enough to spread a large corpus over a cluster, few for a small one


def row_ids(block: pa.Table) -> np.ndarray:
    """int64 [rows]: the input-order id of each row (source, row)."""
    source = block.column("source").to_numpy().astype(np.int64)
    return (source << ROW_BITS) | block.column("row").to_numpy().astype(np.int64)


def bucket_keys(block: pa.Table, buckets: int, canonicalize: bool) -> tuple[pa.Table, ...]:
    """Map: the (key, id) of the block's valid rows, one table per bucket."""
    valid = block.filter(pc.is_null(block.column("reason"))) if block.num_rows else None  # empty: may lack columns
    keys = (duplicate_keys(valid.column("smiles").to_pylist(), canonicalize, valid.column("mol").to_pylist())
            if valid is not None else [])
    ids = row_ids(valid) if valid is not None else np.zeros(0, dtype=np.int64)
    bucket = np.array([zlib.crc32(k.encode()) % buckets for k in keys], dtype=np.int64)  # stable across processes
    table = pa.table({"key": pa.array(keys, pa.string()), "id": pa.array(ids, pa.int64())})
    parts = tuple(table.filter(pa.array(bucket == b)) for b in range(buckets))
    return parts if buckets > 1 else parts[0]


def later_copies(*parts: pa.Table) -> np.ndarray:
    """Reduce: the ids of the rows whose key an earlier id of the bucket holds."""
    table = pa.concat_tables(parts)
    if table.num_rows < 2:
        return np.zeros(0, dtype=np.int64)
    table = table.take(pc.sort_indices(table, sort_keys=[("key", "ascending"), ("id", "ascending")]))
    keys = table.column("key").combine_chunks()
    repeated = pc.equal(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(zero_copy_only=False)
    return table.column("id").to_numpy()[1:][repeated]


def sorted_union(*arrays: np.ndarray) -> np.ndarray:
    return np.sort(np.concatenate([np.zeros(0, dtype=np.int64), *arrays]))


def mark(block: pa.Table, dropped: np.ndarray) -> pa.Table:
    """The block with its ``duplicate`` column set for the dropped copies."""
    if block.num_rows == 0:
        return block
    duplicate = pa.array(np.isin(row_ids(block), dropped))
    return block.set_column(block.schema.get_field_index("duplicate"), "duplicate", duplicate)


def mark_duplicates(cleaned, canonicalize: bool):
    """``cleaned`` (a materialised dataset of clean_block's rows) with every later copy of a molecule marked."""
    import ray

    blocks = cleaned.to_arrow_refs()  # in input order
    if not blocks:
        return cleaned  # no rows: nothing to compare
    buckets = max(1, min(len(blocks), MAX_BUCKETS))
    split = ray.remote(bucket_keys).options(num_returns=buckets)
    keyed = [split.remote(block, buckets, canonicalize) for block in blocks]
    keyed = [parts if buckets > 1 else [parts] for parts in keyed]
    reduce = ray.remote(later_copies)
    dropped = ray.remote(sorted_union).remote(*[reduce.remote(*[parts[b] for parts in keyed]) for b in range(buckets)])
    marked = ray.remote(mark)
    return ray.data.from_arrow_refs([marked.remote(block, dropped) for block in blocks])


__all__ = ["MAX_BUCKETS", "bucket_keys", "later_copies", "mark", "mark_duplicates", "row_ids", "sorted_union"]
