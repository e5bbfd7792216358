"""A rank's global batches read from the shards that hold them (kermt.data.shard_plan draws the plan): a pretraining
corpus's shards (:class:`~kermt.data.corpus.CorpusArrays`) or a finetune split's
(:class:`~kermt.data.dataset.MoleculeSet`), anything with ``take``, ``concat`` and ``len``.

A window's shards are read and joined once, with the epoch's order of its rows as positions into them; a global
batch gathers its rows from there, a batch that spans two windows joining its two parts. The next window is read by
a background thread while the current one is consumed, so what one process holds is bounded by the windows a batch
touches (usually one) plus ``ahead`` windows read ahead, whatever the data set's size; reading a window holds its
shards twice for a moment (the read shards and the joined copy).

How a shard is read is the caller's (``load``: a local or URI read, or a Ray task on the node that has the files;
a set held in memory is its own single shard), so this module only needs the shards' indices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kermt.data.shard_plan import ShardPlan, runs_of


class Molecules(Protocol):
    """What a shard holds: molecules that can be gathered (``take``) and joined (``type(x).concat``)."""

    def __len__(self) -> int: ...

    def take(self, rows: np.ndarray) -> Any: ...


Load = Callable[[int], Any]  # shard index -> its Molecules, in shard order


def _join(parts: Sequence[Any]) -> Any:
    return parts[0] if len(parts) == 1 else type(parts[0]).concat(parts)


@dataclass(frozen=True)
class Rows:
    """Molecules with their rows in the whole set (``ids``: the key of their draws)."""

    ids: np.ndarray
    arrays: Any  # Molecules

    def __len__(self) -> int:
        return len(self.ids)

    def slice(self, start: int, stop: int) -> "Rows":
        return Rows(self.ids[start:stop], self.arrays.take(np.arange(start, stop)))

    @staticmethod
    def concat(parts: Sequence["Rows"]) -> "Rows":
        if len(parts) == 1:
            return parts[0]
        return Rows(np.concatenate([p.ids for p in parts]), _join([p.arrays for p in parts]))


@dataclass(frozen=True)
class Window:
    """A window's shards joined as read, and its training rows in the epoch's order: their ids and their positions
    in ``joined``. A batch gathers only its own rows (no reordered copy of the window)."""

    ids: np.ndarray
    positions: np.ndarray
    joined: Any  # Molecules

    def __len__(self) -> int:
        return len(self.ids)

    def slice(self, start: int, stop: int) -> Rows:
        return Rows(self.ids[start:stop], self.joined.take(self.positions[start:stop]))


def read_window(plan: ShardPlan, epoch: int, window: int, load: Load) -> Window:
    """The training molecules of ``window`` of ``epoch``, in the epoch's order."""
    shards = plan.windows(epoch)[window]
    slots, within = plan.window_rows(epoch, window)
    parts = [load(int(s)) for s in shards]
    starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    joined = _join(parts)
    del parts  # the shards as read are no longer needed once joined
    return Window(plan.offsets[shards][slots] + within, starts[slots] + within, joined)


@dataclass(frozen=True)
class BatchView:
    """A global batch as ``positions`` into ``molecules`` (a window's joined shards; for a batch that spans two
    windows, its rows gathered), with its rows' ``ids``: a rank collates its share straight from there."""

    molecules: Any  # Molecules
    positions: np.ndarray
    ids: np.ndarray


def epoch_batches(plan: ShardPlan, epoch: int, global_batch_size: int, first_batch: int, load: Load,
                  ahead: int = 1) -> Iterator[Rows]:
    """Every global batch of ``epoch`` from ``first_batch`` on, gathered (:func:`epoch_views`)."""
    for view in epoch_views(plan, epoch, global_batch_size, first_batch, load, ahead):
        yield Rows(view.ids, view.molecules.take(view.positions))


def epoch_views(plan: ShardPlan, epoch: int, global_batch_size: int, first_batch: int, load: Load,
                ahead: int = 1) -> Iterator[BatchView]:
    """Every global batch of ``epoch`` from ``first_batch`` on as a view, the next ``ahead`` windows read in a
    background thread meanwhile; a window is dropped once no later batch needs it."""
    sizes = plan.window_sizes(epoch)
    held: dict[int, Future[Window]] = {}
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
            if len(pieces) == 1:  # the usual case: nothing gathered here
                window, start, stop = pieces[0]
                part = held[window].result()
                yield BatchView(part.joined, part.positions[start:stop], part.ids[start:stop])
            else:
                rows = Rows.concat([held[w].result().slice(start, stop) for w, start, stop in pieces])
                yield BatchView(rows.arrays, np.arange(len(rows), dtype=np.int64), rows.ids)
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


__all__ = ["BatchView", "Load", "Molecules", "Rows", "Window", "epoch_batches", "epoch_views", "read_window",
           "validation_batches"]
