"""How inference feeds the device: batches of consecutive rows, built on the host ahead of the model.

A block is predicted in batches of ``batch_size`` consecutive rows (the batch rule, see :mod:`kermt.inference`).
A background thread collates each batch's valid molecules with the model's neighbour-sum operators and prepares
its inputs (:func:`kermt.data.prefetch.prefetch`: pinned and copied without waiting on a GPU), and batch k + 1 is
launched before batch k's results are read back, so the device does not wait for the host between batches: with
the operators built here, a forward asks nothing of the host until its results are read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from kermt.data.batch import BatchMolGraph
from kermt.data.featurize import FeaturizedMolecules
from kermt.data.operators import OperatorSpec
from kermt.data.prefetch import prefetch, read_behind, transfer

Launched = TypeVar("Launched")
Read = TypeVar("Read")
Inputs = Callable[[FeaturizedMolecules], tuple[torch.Tensor | None, ...]]


def batch_starts(n_rows: int, batch_size: int) -> range:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return range(0, n_rows, batch_size)


def valid_batches(molecules: FeaturizedMolecules, batch_size: int) -> Iterator[tuple[np.ndarray, FeaturizedMolecules]]:
    """(rows, their molecules) for the valid rows of every batch of consecutive rows that has any."""
    valid = molecules.valid
    for start in batch_starts(len(molecules), batch_size):
        rows = start + np.flatnonzero(valid[start : start + batch_size])
        if len(rows):
            yield rows, molecules.select(rows)


@dataclass(frozen=True)
class InferenceBatch:
    """The valid molecules of one batch: ``rows`` [M] int64 (their rows in the block), ``graph`` (collated with
    the model's operators) and ``inputs``, what the model needs besides (e.g. each member's scaled features
    [M, F] float32, or None)."""

    rows: np.ndarray
    graph: BatchMolGraph
    inputs: tuple[torch.Tensor | None, ...]

    @classmethod
    def of(cls, rows: np.ndarray, molecules: FeaturizedMolecules, operators: OperatorSpec | None,
           inputs: Inputs) -> "InferenceBatch":
        """``molecules`` (every one valid; at block rows ``rows``) collated with ``operators``, on the host."""
        return cls(rows, molecules.batch_graph(operators), inputs(molecules))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "InferenceBatch":
        return self._moved(device, non_blocking)

    def pin_memory(self) -> "InferenceBatch":
        return self._moved(None, False)

    def _moved(self, device: torch.device | str | None, non_blocking: bool) -> "InferenceBatch":
        inputs = tuple(transfer(t, device, non_blocking) for t in self.inputs)
        return InferenceBatch(self.rows, transfer(self.graph, device, non_blocking), inputs)


def run_batches(molecules: FeaturizedMolecules, batch_size: int, operators: OperatorSpec | None,
                inputs: Inputs, device: torch.device, forward: Callable[[InferenceBatch], Launched],
                read: Callable[[Launched], Read]) -> list[tuple[np.ndarray, Read]]:
    """[(rows, read(forward(batch)))] for every batch of ``molecules`` with valid rows (see the module docstring).

    ``forward`` runs on the batch on ``device`` and returns what it launched there (tensors still on the device);
    ``read`` brings that to the host. ``inputs`` runs in the background thread, with the collate.
    """
    def build() -> Iterator[InferenceBatch]:
        for rows, part in valid_batches(molecules, batch_size):
            yield InferenceBatch.of(rows, part, operators, inputs)

    launched = ((batch.rows, forward(batch)) for batch in prefetch(build(), device))
    return list(read_behind(launched, lambda pair: (pair[0], read(pair[1]))))


__all__ = ["InferenceBatch", "batch_starts", "run_batches", "valid_batches"]
