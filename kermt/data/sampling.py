"""The batch plan of an epoch: which molecules form global batch k, and which part of it each worker takes.

The plan depends only on (number of molecules, global batch size, seed, epoch), never on the number of workers:
global batch k holds the same molecules on 1 worker with batch 2b as on 2 workers with batch b each, every
molecule is used exactly once per epoch (no padding duplicates, no dropped tail), and a seed reproduces the order.
"""

from __future__ import annotations

import numpy as np

from kermt.random_streams import Stream, stream_rng


def epoch_order(num_molecules: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Row order of one epoch [num_molecules] int64: a permutation drawn from (seed, epoch), or 0..n-1."""
    if not shuffle:
        return np.arange(num_molecules, dtype=np.int64)
    return stream_rng(seed, Stream.EPOCH_ORDER, epoch).permutation(num_molecules).astype(np.int64)


def global_batches(order: np.ndarray, global_batch_size: int) -> list[np.ndarray]:
    """Consecutive chunks of ``order``; the last one may be smaller."""
    if global_batch_size < 1:
        raise ValueError(f"global batch size must be >= 1, got {global_batch_size}")
    return [order[i : i + global_batch_size] for i in range(0, len(order), global_batch_size)]


def worker_share(batch: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous slice of a global batch; sizes differ by at most one and may be 0 in a tail."""
    return np.array_split(batch, world_size)[rank]

