"""The acquisition over a library's predictions one block at a time: what a round chooses without any array the size
of the library.

:func:`acquire_in_blocks` reads the predictions as consecutive blocks of rows, computes each block's acquisition
values (:func:`kermt.explore.acquisition.acquisition_values`, on the same generator in row order, so thompson's and
random's draws are those of one call on the whole library) and keeps only a running top of ``size`` candidates. The
batch is exactly :func:`~kermt.explore.acquisition.top_batch`'s on the whole arrays: the ``size`` largest finite
values not explored, best first, ties to the lower row. What the driver holds is a block, the explored rows and at
most about twice ``size`` candidates (their value, row, mean and std).

:func:`random_rows` is :func:`~kermt.explore.acquisition.random_batch` without the library-wide mask: the same
draws, mapped from positions among the unexplored rows to rows through the sorted explored rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kermt.explore.acquisition import DEFAULT_BETA, Surrogate, acquisition_values

# candidates held before the running top is cut back to its size (at least this many, or twice the size): a cut is
# a pass over what is held, so it waits until that pass is worth it
MIN_HELD = 1 << 16


@dataclass(frozen=True)
class Chosen:
    """A batch, best first: its library ``rows`` (int64) and, per row, the acquisition ``values`` and the surrogate's
    ``mean`` and ``std`` (float64, as read)."""

    rows: np.ndarray
    values: np.ndarray
    mean: np.ndarray
    std: np.ndarray


class RunningTop:
    """The ``size`` best candidates offered so far, by value (larger first) and then row (lower first). Candidates
    must come in increasing row order: a later one that ties the size-th best value is then never better than it."""

    def __init__(self, size: int, min_held: int = MIN_HELD) -> None:
        self.size, self.min_held = max(int(size), 0), min_held
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._held = 0
        # once size candidates are held, a new one must beat the size-th best value (ties go to the earlier row)
        self._floor = -np.inf if self.size else np.inf

    def offer(self, rows: np.ndarray, values: np.ndarray, mean: np.ndarray, std: np.ndarray) -> None:
        """Candidates (finite values, rows not yet offered and above every earlier one's)."""
        better = values > self._floor
        if not better.all():
            rows, values, mean, std = rows[better], values[better], mean[better], std[better]
        if len(rows):
            self._parts.append((rows, values, mean, std))
            self._held += len(rows)
        if self._held > max(2 * self.size, self.min_held):
            self._cut()

    @property
    def held(self) -> int:
        """Candidates held now: at most max(2 size, min_held) between offers."""
        return self._held

    def chosen(self) -> Chosen:
        """The candidates kept, best first."""
        rows, values, mean, std = self._cut()
        order = np.lexsort((rows, -values))
        return Chosen(rows[order], values[order], mean[order], std[order])

    def _cut(self) -> tuple[np.ndarray, ...]:
        held = tuple(np.concatenate(column) for column in zip(*self._parts)) if self._parts else \
            (np.zeros(0, np.int64), *(np.zeros(0) for _ in range(3)))
        keep = _best(held[0], held[1], self.size)
        held = tuple(column[keep] for column in held)
        self._parts, self._held = [held], len(keep)
        if len(keep) == self.size and self.size:
            self._floor = float(held[1].min())
        return held


def _best(rows: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Positions of the ``size`` best (value, then lower row), in no particular order."""
    if len(values) <= size:
        return np.arange(len(values))
    cut = np.partition(values, len(values) - size)[len(values) - size]  # the size-th largest value
    above = np.flatnonzero(values > cut)
    at = np.flatnonzero(values == cut)
    at = at[np.argsort(rows[at], kind="stable")[:size - len(above)]]
    return np.concatenate([above, at])


def acquire_in_blocks(acquisition: str, blocks: Iterable[tuple[int, Surrogate]], explored_rows: np.ndarray,
                      size: int, best: float, rng: np.random.Generator, beta: float = DEFAULT_BETA,
                      minimize: bool = False) -> Chosen:
    """The ``size`` rows of highest acquisition value that are not ``explored_rows``, from ``blocks``: (first row,
    the surrogate's prediction of the block's rows), consecutive from row 0. The arguments after ``size`` are
    :func:`~kermt.explore.acquisition.acquisition_values`'s."""
    explored_rows = np.unique(np.asarray(explored_rows, dtype=np.int64))
    top, expected = RunningTop(size), 0
    for start, surrogate in blocks:
        if start != expected:
            raise ValueError(f"a block starts at row {start}, not {expected}: blocks must be consecutive")
        values = acquisition_values(acquisition, surrogate, best, rng, beta=beta, minimize=minimize)
        expected = start + len(values)
        wanted = np.isfinite(values)
        wanted[explored_rows[np.searchsorted(explored_rows, start):np.searchsorted(explored_rows, expected)] -
               start] = False
        std = surrogate.std if surrogate.std is not None else np.full(len(values), np.nan)
        at = np.flatnonzero(wanted)
        top.offer(start + at, values[at], np.asarray(surrogate.mean, np.float64)[at], np.asarray(std, np.float64)[at])
    return top.chosen()


def random_rows(explored_rows: np.ndarray, rows: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` of ``rows`` library rows drawn uniformly without replacement from those not ``explored_rows``, in
    draw order: random_batch's rows for the same generator, without a mask of the library."""
    explored_rows = np.unique(np.asarray(explored_rows, dtype=np.int64))
    left = rows - len(explored_rows)
    picks = rng.choice(left, size=min(size, left), replace=False)  # positions among the unexplored rows
    # the unexplored rows before each explored one: position p lies past every explored row with at most p before it
    before = explored_rows - np.arange(len(explored_rows))
    return picks + np.searchsorted(before, picks, side="right")


__all__ = ["Chosen", "RunningTop", "acquire_in_blocks", "random_rows"]
