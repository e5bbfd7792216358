"""A rank's global batches read from the corpus shards that hold them (kermt.data.shard_plan draws the plan).

A window's shards are read, joined and put in the epoch's order once; the global batches are slices of it, a batch
that spans two windows joining its two slices. The next window is read by a background thread while the current
one is consumed, so what one process holds is bounded by the windows a batch touches (usually one) plus
``ahead`` windows read ahead, whatever the corpus size; reading a window holds its shards twice for a moment (the
read shards and the reordered copy).

How a shard is read is the caller's (``load``: a local or URI read, or a Ray task on the node that has the files),
so this module only needs the shards' indices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kermt.data.corpus import CorpusArrays
from kermt.data.shard_plan import ShardPlan, runs_of

Load = Callable[[int], CorpusArrays]  # shard index -> its molecules, in shard order


@dataclass(frozen=True)
class Rows:
    """Molecules with their corpus rows (``ids``: the key of their draws)."""

    ids: np.ndarray
    arrays: CorpusArrays

    def __len__(self) -> int:
        return len(self.ids)

    def slice(self, start: int, stop: int) -> "Rows":
        return Rows(self.ids[start:stop], self.arrays.take(np.arange(start, stop)))

    @staticmethod
    def concat(parts: Sequence["Rows"]) -> "Rows":
        if len(parts) == 1:
            return parts[0]
        return Rows(np.concatenate([p.ids for p in parts]), CorpusArrays.concat([p.arrays for p in parts]))


def read_window(plan: ShardPlan, epoch: int, window: int, load: Load) -> Rows:
    """The training molecules of ``window`` of ``epoch``, in the epoch's order."""
    shards = plan.windows(epoch)[window]
    slots, within = plan.window_rows(epoch, window)
    parts = [load(int(s)) for s in shards]
    starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    joined = CorpusArrays.concat(parts)
    del parts  # the shards as read are no longer needed once joined
    return Rows(plan.offsets[shards][slots] + within, joined.take(starts[slots] + within))


def epoch_batches(plan: ShardPlan, epoch: int, global_batch_size: int, first_batch: int, load: Load,
                  ahead: int = 1) -> Iterator[Rows]:
    """Every global batch of ``epoch`` from ``first_batch`` on, the next ``ahead`` windows read in a background
    thread meanwhile; a window is dropped once no later batch needs it."""
    sizes = plan.window_sizes(epoch)
    held: dict[int, Future[Rows]] = {}
    pool = ThreadPoolExecutor(1, thread_name_prefix="kermt-shards")
    try:
        for batch in range(first_batch, plan.batch_count(global_batch_size)):
            pieces = runs_of(sizes, batch * global_batch_size, global_batch_size, plan.n_train)
            first, last = pieces[0][0], pieces[-1][0]
            for window in [w for w in held if w < first]:
                del held[window]
            for window in range(first, min(last + 1 + ahead, len(sizes))):
                if window not in held and sizes[window]:
                    held[window] = pool.submit(read_window, plan, epoch, window, load)
            yield Rows.concat([held[w].result().slice(start, stop) for w, start, stop in pieces])
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def validation_batches(plan: ShardPlan, global_batch_size: int, max_batches: int, load: Load) -> list[Rows]:
    """The plan's first ``max_batches`` validation batches; each shard they use is read once, one at a time, and only
    its held-out rows that the batches take are kept."""
    batches = plan.val_batch_pieces(global_batch_size, max_batches)
    needed: dict[int, int] = {}
    for pieces in batches:
        for shard, _, stop in pieces:
            needed[shard] = max(needed.get(shard, 0), stop)
    kept = {}
    for shard, stop in needed.items():
        rows = plan.split(shard)[1][:stop]
        kept[shard] = Rows(plan.offsets[shard] + rows, load(shard).take(rows))
    return [Rows.concat([kept[s].slice(start, stop) for s, start, stop in pieces]) for pieces in batches]


__all__ = ["Load", "Rows", "epoch_batches", "read_window", "validation_batches"]
