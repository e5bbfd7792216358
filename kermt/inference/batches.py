"""How inference feeds the device: batches of consecutive rows, built on the host ahead of the model.

A block is predicted in batches of ``batch_size`` rows: the rows of each neighbour width together
(:mod:`kermt.inference.widths`), or with upstream's batching consecutive rows (see :mod:`kermt.inference`).
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


def atom_budget_starts(atom_counts: np.ndarray, batch_size: int, max_atoms: int) -> list[int]:
    """Starts of batches of consecutive rows holding at most ``batch_size`` rows and ``max_atoms`` atoms (a row
    with more atoms than that is a batch of its own). For blocks whose numbers do not depend on how they are cut:
    molecules of a batch-independent model, or ones collated at a fixed neighbour width."""
    if max_atoms < 1:
        raise ValueError(f"max_atoms must be >= 1, got {max_atoms}")
    starts, rows, atoms = [], batch_size, 0
    for row, count in enumerate(np.asarray(atom_counts, dtype=np.int64).tolist()):
        if rows == batch_size or (atoms + count > max_atoms and rows):
            starts.append(row)
            rows, atoms = 0, 0
        rows, atoms = rows + 1, atoms + count
    return starts


def row_batches(valid: np.ndarray, batch_size: int, widths: np.ndarray | None = None,
                atom_counts: np.ndarray | None = None,
                max_atoms: int | None = None) -> Iterator[tuple[np.ndarray, int]]:
    """(rows, neighbour width) of every batch to collate: the valid ones among ``batch_size`` rows (with
    ``max_atoms`` also at most that many atoms, :func:`atom_budget_starts`).

    ``widths`` None: the batch rule, batches of consecutive rows, each at its own width (given as 1: the collate
    takes the batch's largest degree; upstream's batching). Otherwise ``widths`` [N] int64 gives each row its width
    (0: invalid): the rows of each width, in order, are cut into batches collated at exactly that width, so numbers
    depend on each molecule's width only, never on how the rows are cut or ordered (:mod:`kermt.inference.widths`).
    """
    if widths is None:
        groups = [(np.arange(len(valid)), 1)]
    else:
        groups = [(np.flatnonzero(widths == width), width) for width in np.unique(widths[widths > 0]).tolist()]
    for group, width in groups:
        starts = (list(batch_starts(len(group), batch_size)) if max_atoms is None
                  else atom_budget_starts(atom_counts[group], batch_size, max_atoms))
        for start, stop in zip(starts, starts[1:] + [len(group)]):
            rows = group[start + np.flatnonzero(valid[group[start:stop]])]
            if len(rows):
                yield rows, width


def valid_batches(molecules: FeaturizedMolecules, batch_size: int,
                  max_atoms: int | None = None) -> Iterator[tuple[np.ndarray, FeaturizedMolecules]]:
    """(rows, their molecules) for the valid rows of every batch of consecutive rows that has any: batches of
    ``batch_size`` rows (the batch rule), or with ``max_atoms`` also at most that many atoms
    (:func:`atom_budget_starts`)."""
    for rows, _ in row_batches(molecules.valid, batch_size, None, molecules.graphs.atom_counts, max_atoms):
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
           inputs: Inputs, neighbour_width: int = 1) -> "InferenceBatch":
        """``molecules`` (every one valid; at block rows ``rows``) collated with ``operators`` and neighbour tables
        at least ``neighbour_width`` wide, on the host."""
        return cls(rows, molecules.batch_graph(operators, neighbour_width), inputs(molecules))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "InferenceBatch":
        return self._moved(device, non_blocking)

    def pin_memory(self) -> "InferenceBatch":
        return self._moved(None, False)

    def _moved(self, device: torch.device | str | None, non_blocking: bool) -> "InferenceBatch":
        inputs = tuple(transfer(t, device, non_blocking) for t in self.inputs)
        return InferenceBatch(self.rows, transfer(self.graph, device, non_blocking), inputs)


def run_batches(molecules: FeaturizedMolecules, batch_size: int, operators: OperatorSpec | None,
                inputs: Inputs, device: torch.device, forward: Callable[[InferenceBatch], Launched],
                read: Callable[[Launched], Read], *, widths: np.ndarray | None = None,
                max_atoms: int | None = None) -> list[tuple[np.ndarray, Read]]:
    """[(rows, read(forward(batch)))] for every batch of ``molecules`` with valid rows (see the module docstring).

    ``forward`` runs on the batch on ``device`` and returns what it launched there (tensors still on the device);
    ``read`` brings that to the host. ``inputs`` runs in the background thread, with the collate.
    ``widths`` / ``max_atoms``: which rows share a batch and at what neighbour width (:func:`row_batches`).
    """
    def build() -> Iterator[InferenceBatch]:
        for rows, width in row_batches(molecules.valid, batch_size, widths, molecules.graphs.atom_counts, max_atoms):
            yield InferenceBatch.of(rows, molecules.select(rows), operators, inputs, width)

    launched = ((batch.rows, forward(batch)) for batch in prefetch(build(), device))
    return list(read_behind(launched, lambda pair: (pair[0], read(pair[1]))))


__all__ = ["InferenceBatch", "atom_budget_starts", "batch_starts", "row_batches", "run_batches",
           "valid_batches"]
