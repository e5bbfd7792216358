"""Pretraining's epoch plan over a sharded corpus: which rows of which shard form global batch k, drawn without any
process holding per-row state for the whole corpus.

Only the shards' row counts (the manifest's) are global; everything per row is drawn for one shard or one window at
a time, from (seed, epoch, shard or window) alone, so every rank, a restarted group and a group of another size draw
the same plan:

- validation rows: ``round(n × val_fraction)`` in all, spread over the shards in proportion to their rows (largest
  remainders); which rows of shard s are held out is a permutation drawn from (seed, s). Validation batches take the
  held-out rows in shard order.
- epoch order: the shards are permuted from (seed, epoch) and cut into windows of ``window`` consecutive shards;
  the training rows of a window are permuted from (seed, epoch, window) (a block shuffle). The epoch's order is the
  windows' orders one after the other, cut into global batches of the fixed global batch size (a batch may span
  two windows; the last one may be smaller), each rank taking its contiguous share (:func:`worker_share`).
- one window that holds every shard is the plain full shuffle: the shards in their own order and the training rows
  permuted from (seed, epoch) as :func:`kermt.data.sampling.epoch_order` draws them. So a set small enough for one
  window (finetuning's usual case, or one held in memory as a single shard) gets exactly the order it had before it
  was sharded, by this same rule.

A molecule's id (the key of its labels, latent and dropout draws) is its corpus row: the shard's first row plus its
row in the shard, as when the corpus was one array.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kermt.data.sampling import epoch_order
from kermt.random_streams import Stream, stream_rng

Pieces = list[tuple[int, int, int]]  # (window or shard index, start, stop): consecutive runs of a batch's rows


@dataclass(frozen=True)
class ShardPlan:
    """The plan of a corpus whose shards hold ``shard_rows`` molecules each (the manifest's order)."""

    shard_rows: tuple[int, ...]
    seed: int
    val_fraction: float
    window: int = 4  # shards whose training rows are shuffled together

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"the shuffle window must hold at least 1 shard, got {self.window}")

    @cached_property
    def offsets(self) -> np.ndarray:
        """int64 [shards + 1]: the corpus row of each shard's first molecule."""
        return np.concatenate([[0], np.cumsum(np.asarray(self.shard_rows, dtype=np.int64))])

    @cached_property
    def val_counts(self) -> np.ndarray:
        """int64 [shards]: held-out rows per shard, summing to round(n × val_fraction) (none for a 1-molecule
        corpus)."""
        rows = np.asarray(self.shard_rows, dtype=np.int64)
        n = int(rows.sum())
        total = int(round(n * self.val_fraction)) if n > 1 else 0
        exact = rows * (total / n) if n else rows.astype(np.float64)
        counts = np.floor(exact).astype(np.int64)
        by_remainder = np.argsort(-(exact - counts), kind="stable")  # ties: the earlier shard
        counts[by_remainder[:total - int(counts.sum())]] += 1
        return counts

    @property
    def train_counts(self) -> np.ndarray:
        return np.asarray(self.shard_rows, dtype=np.int64) - self.val_counts

    @property
    def n_train(self) -> int:
        return int(self.train_counts.sum())

    @property
    def n_val(self) -> int:
        return int(self.val_counts.sum())

    def split(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """(training rows, validation rows) of ``shard``, rows within the shard, each sorted."""
        order = stream_rng(self.seed, Stream.VALIDATION_ROWS, shard).permutation(self.shard_rows[shard])
        n_val = int(self.val_counts[shard])
        return np.sort(order[n_val:]).astype(np.int64), np.sort(order[:n_val]).astype(np.int64)

    def windows(self, epoch: int) -> list[np.ndarray]:
        """The shards of each window of ``epoch``, in the epoch's order (one window: every shard, in shard order)."""
        if self.single_window:
            return [np.arange(len(self.shard_rows), dtype=np.int64)]
        shards = stream_rng(self.seed, Stream.EPOCH_ORDER, epoch).permutation(len(self.shard_rows))
        return [shards[i:i + self.window].astype(np.int64) for i in range(0, len(shards), self.window)]

    @property
    def single_window(self) -> bool:
        """Whether one window holds every shard (the full shuffle)."""
        return len(self.shard_rows) <= self.window

    def window_sizes(self, epoch: int) -> np.ndarray:
        """int64 [windows]: training rows of each window of ``epoch``."""
        train = self.train_counts
        return np.array([int(train[w].sum()) for w in self.windows(epoch)], dtype=np.int64)

    def window_rows(self, epoch: int, window: int) -> tuple[np.ndarray, np.ndarray]:
        """(slot, row) [window's training rows]: the window's rows in epoch order, each as the position of its shard
        in ``windows(epoch)[window]`` and its row in that shard."""
        shards = self.windows(epoch)[window]
        rows = [self.split(int(s))[0] for s in shards]
        slots = np.repeat(np.arange(len(shards), dtype=np.int64), [len(r) for r in rows])
        within = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        if self.single_window:
            order = epoch_order(len(within), self.seed, epoch)
        else:
            order = stream_rng(self.seed, Stream.SHUFFLE_WINDOW, epoch, window).permutation(len(within))
        return slots[order], within[order]

    def epoch_ids(self, epoch: int) -> np.ndarray:
        """int64 [n_train]: the ids (rows of the whole set) of ``epoch``'s training rows in the epoch's order. Only
        ints, drawn window by window; for what needs the whole order at once (a width histogram), never to read."""
        parts = []
        for window, shards in enumerate(self.windows(epoch)):
            slots, within = self.window_rows(epoch, window)
            parts.append(self.offsets[shards][slots] + within)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def batch_count(self, global_batch_size: int) -> int:
        """Global batches of every epoch."""
        if global_batch_size < 1:
            raise ValueError(f"global batch size must be >= 1, got {global_batch_size}")
        return -(-self.n_train // global_batch_size)

    def batch_pieces(self, epoch: int, batch: int, global_batch_size: int) -> Pieces:
        """Global batch ``batch`` of ``epoch`` as (window, start, stop) runs of the windows' epoch orders."""
        return runs_of(self.window_sizes(epoch), batch * global_batch_size, global_batch_size, self.n_train)

    def val_batch_pieces(self, global_batch_size: int, max_batches: int) -> list[Pieces]:
        """The first ``max_batches`` validation batches as (shard, start, stop) runs of each shard's validation
        rows (:meth:`split`), the held-out rows taken in shard order."""
        if global_batch_size < 1:
            raise ValueError(f"global batch size must be >= 1, got {global_batch_size}")
        count = min(max_batches, -(-self.n_val // global_batch_size))
        return [runs_of(self.val_counts, k * global_batch_size, global_batch_size, self.n_val) for k in range(count)]


def runs_of(sizes: np.ndarray, start: int, length: int, total: int) -> Pieces:
    """Positions [start, min(start + length, total)) of the concatenation of parts of ``sizes`` rows, as
    (part, start, stop) runs within the parts (empty parts skipped)."""
    stop, bounds, pieces = min(start + length, total), np.concatenate([[0], np.cumsum(sizes)]), []
    for part in range(len(sizes)):
        low, high = max(start, int(bounds[part])), min(stop, int(bounds[part + 1]))
        if low < high:
            pieces.append((part, low - int(bounds[part]), high - int(bounds[part])))
    return pieces


__all__ = ["Pieces", "ShardPlan", "runs_of"]
