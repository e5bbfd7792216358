"""MoleculeSet: the featurised, scaled molecules of one split, and how a batch of them is built.

Rows are indexed 0..n-1 inside the set; a batch's graph carries them as its ``molecule_ids`` (the key of
per-molecule dropout draws), or the ids it is given: a set that is one global batch gathered from a split's shards
(kermt.data.shard_stream) passes the molecules' rows in the whole split, so their draws are the same as when the
split was one set. Building a batch is a vectorised gather from the flat arrays (no per-molecule Python
objects), optionally with bond dropout drawn per molecule from (seed, step, molecule, bond), so the dropped bonds of
a molecule do not depend on its batch or on how a global batch is spread over workers. Batches reach the device
through :func:`kermt.data.prefetch.prefetch`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from kermt.chem.molgraph import FlatGraphs
from kermt.data.batch import BatchMolGraph
from kermt.data.collate import collate_graphs
from kermt.random_streams import Stream, hashed_uniform, positions_within
from kermt.data.operators import OperatorSpec
from kermt.data.prefetch import transfer_fields


@dataclass(frozen=True)
class MoleculeBatch:
    """graph: M molecules; features [M, F] float32 or None; targets [M, T] float32 with NaN = missing.

    global_label_counts [T] float32 or None: labels per task in the whole GLOBAL batch this batch is a worker's
    share of, counted on the host when the batch was built (the train step then needs no collective for it).
    """

    graph: BatchMolGraph
    features: torch.Tensor | None
    targets: torch.Tensor
    rows: np.ndarray
    global_label_counts: torch.Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "MoleculeBatch":
        """The batch on ``device``; ``non_blocking`` copies asynchronously (from pinned memory)."""
        return transfer_fields(self, _MOVED, device, non_blocking)

    def pin_memory(self) -> "MoleculeBatch":
        """The batch in page-locked host memory (for an asynchronous copy to a CUDA device)."""
        return transfer_fields(self, _MOVED, None, False)


_MOVED = ("graph", "features", "targets", "global_label_counts")  # MoleculeBatch's tensors (``rows`` stay numpy)


@dataclass(frozen=True)
class MoleculeSet:
    """One split, ready to batch. Every row is a valid molecule.

    graphs    FlatGraphs with n entries
    features  float32 [n, F] (already scaled) or None
    targets   float32 [n, T] (regression: scaled for train/val), NaN = missing label
    smiles    the n SMILES, for outputs
    """

    graphs: FlatGraphs
    features: np.ndarray | None
    targets: np.ndarray
    smiles: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.smiles)

    def take(self, rows: np.ndarray) -> "MoleculeSet":
        """The molecules at ``rows``, in that order (a vectorised gather)."""
        rows = np.asarray(rows, dtype=np.int64)
        return MoleculeSet(self.graphs.select(rows), None if self.features is None else self.features[rows],
                           self.targets[rows], tuple(self.smiles[i] for i in rows))

    @staticmethod
    def concat(parts: "list[MoleculeSet] | tuple[MoleculeSet, ...]") -> "MoleculeSet":
        """The molecules of ``parts``, one after the other."""
        if len(parts) == 1:
            return parts[0]
        arrays = [p.graphs.to_arrays() for p in parts]
        graphs = FlatGraphs.from_arrays({name: np.concatenate([a[name] for a in arrays]) for name in arrays[0]})
        features = None if parts[0].features is None else np.concatenate([p.features for p in parts])
        return MoleculeSet(graphs, features, np.concatenate([p.targets for p in parts]),
                           tuple(s for p in parts for s in p.smiles))

    def bond_counts(self, rows: np.ndarray) -> np.ndarray:
        return self.graphs.bond_counts[np.asarray(rows, dtype=np.int64)]

    def neighbour_width(self, rows: np.ndarray, keep_bond: np.ndarray | None = None) -> int:
        """The neighbour-table width of a batch of ``rows`` (after bond dropout ``keep_bond``): its largest atom
        degree, at least 1 (docs/numerics.md#batch-composition)."""
        degrees = self.graphs.select(np.asarray(rows, dtype=np.int64), keep_bond).max_in_degrees()
        return max(1, int(degrees.max(initial=0)))

    def batch(
        self,
        rows: np.ndarray,
        keep_bond: np.ndarray | None = None,
        operators: OperatorSpec | None = None,
        global_rows: np.ndarray | None = None,
        neighbour_width: int = 1,
        ids: np.ndarray | None = None,
    ) -> MoleculeBatch:
        """Collate ``rows`` into one batch (row 0 padding, upstream layout).

        operators        the model's ``aggregation_spec``: build its neighbour-sum operators here, on the CPU
        global_rows      the global batch ``rows`` belong to: count its labels here (``global_label_counts``)
        neighbour_width  the least width of the neighbour tables: a worker's share takes its global batch's
                         (:meth:`neighbour_width`), so that with upstream's padding its sums are the whole batch's
        ids              the molecules' keys (``molecule_ids``, the batch's ``rows``); default: ``rows``
        """
        rows = np.asarray(rows, dtype=np.int64)
        keys = rows if ids is None else np.asarray(ids, dtype=np.int64)
        ids_tensor = torch.tensor(keys, dtype=torch.int64, device="cpu")  # a copy (may be read-only), on the host
        flat = self.graphs.select(rows, keep_bond)
        graph = replace(collate_graphs(flat, operators, neighbour_width), molecule_ids=ids_tensor)
        features = torch.from_numpy(self.features[rows]) if self.features is not None else None
        counts = None
        if global_rows is not None:
            labelled = ~np.isnan(self.targets[np.asarray(global_rows, dtype=np.int64)])
            counts = torch.from_numpy(labelled.sum(axis=0).astype(np.float32))
        return MoleculeBatch(graph, features, torch.from_numpy(self.targets[rows]), keys, counts)


def bond_keep_mask(rows: np.ndarray, bond_counts: np.ndarray, drop_rate: float, seed: int, step: int) -> np.ndarray:
    """Keep flags for every chemical bond of the molecules ``rows`` (in order; ``bond_counts`` indexed by row), each
    a Bernoulli draw keyed by (seed, step, molecule row, bond index): the same for a molecule in any batch."""
    rows = np.asarray(rows, dtype=np.int64)
    return keyed_bond_keep(rows, bond_counts[rows], drop_rate, seed, step)


def keyed_bond_keep(ids: np.ndarray, bond_counts: np.ndarray, drop_rate: float, seed: int, step: int) -> np.ndarray:
    """:func:`bond_keep_mask` for molecules given by their keys ``ids`` and their own ``bond_counts`` (aligned)."""
    owner, position = positions_within(np.asarray(bond_counts))
    keys = np.asarray(ids, dtype=np.int64)[owner]
    return hashed_uniform(seed, Stream.BOND_DROPOUT, step, keys, position) >= drop_rate
