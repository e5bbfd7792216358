"""Vectorised collate: many molecule graphs -> one BatchMolGraph in upstream's layout.

Upstream behaviour: docs/upstream-compatibility.md#batch-graph.

Everything is numpy concatenation plus offsets: no Python loop over atoms or bonds, so collating a batch costs
far less than featurising it. Row 0 of atoms and edges is the zero padding row; molecule atoms start at 1.
Given the model's :class:`~kermt.data.operators.OperatorSpec`, the collate also builds the neighbour-sum operators
(on the CPU, in the data loader), so the step on the device never has to.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from kermt.chem.features import ATOM_FDIM, BOND_FDIM
from kermt.chem.molgraph import FlatGraphs, MolGraph, grouped_positions
from kermt.data.batch import BatchMolGraph
from kermt.data.operators import OperatorSpec, build_operators


def collate_graphs(graphs: Sequence[MolGraph] | FlatGraphs, operators: OperatorSpec | None = None,
                   neighbour_width: int = 1) -> BatchMolGraph:
    """Build the batch graph of ``graphs`` (a list of MolGraph or an already flat FlatGraphs), with the
    operators ``operators`` names (see ``aggregation_spec`` of the encoder) when given.

    ``neighbour_width``: the least width of the neighbour tables ``a2b``/``a2a`` (padded with 0). Upstream's
    padding makes sums depend on that width, so a worker's share of a global batch takes the global batch's.
    """
    flat = graphs if isinstance(graphs, FlatGraphs) else FlatGraphs.from_graphs(graphs)
    arrays = collate_arrays(flat, neighbour_width)
    return BatchMolGraph(
        **{name: torch.from_numpy(value) for name, value in arrays.items()},
        operators=build_operators(arrays, operators) if operators is not None else None,
        max_atoms=int(arrays["a_scope"][:, 1].max(initial=0)),
        max_bonds=int(arrays["b_scope"][:, 1].max(initial=0)),
    )


def collate_arrays(flat: FlatGraphs, neighbour_width: int = 1) -> dict[str, np.ndarray]:
    """The BatchMolGraph fields as numpy arrays (same names, shapes and dtypes as the tensors).

    The store's small dtypes (int32 counts, uint16 local ids, coded rows) are widened here, per batch: the
    feature rows are expanded from their codes (exact, see kermt.chem.codes) and every index becomes int64.
    """
    atom_counts, bond_counts = flat.atom_counts.astype(np.int64), flat.bond_counts.astype(np.int64)
    atom_start = 1 + np.cumsum(atom_counts) - atom_counts  # first atom row of each molecule
    edge_counts = 2 * bond_counts
    edge_start = 1 + np.cumsum(edge_counts) - edge_counts

    n_atoms = 1 + int(atom_counts.sum())
    n_edges = 1 + int(edge_counts.sum())
    bond_atom_offset = np.repeat(atom_start, bond_counts)[:, None]
    global_pairs = flat.bond_atoms.astype(np.int64) + bond_atom_offset  # [n_chem_bonds, 2]

    b2a = np.zeros(n_edges, dtype=np.int64)
    b2a[1:] = global_pairs.reshape(-1)  # edge 2k+1 (1-based: 2k+1, 2k+2) = a1->a2, a2->a1
    # Every molecule owns an even number of edges and edges start at 1, so the reverse of edge e >= 1 is
    # ((e - 1) xor 1) + 1: the pair partner inside the same molecule.
    b2revb = np.zeros(n_edges, dtype=np.int64)
    b2revb[1:] = ((np.arange(1, n_edges) - 1) ^ 1) + 1

    f_atoms = np.zeros((n_atoms, ATOM_FDIM), dtype=np.float32)
    f_atoms[1:] = flat.f_atoms
    f_bonds = np.zeros((n_edges, BOND_FDIM), dtype=np.float32)
    f_bonds[1:, :ATOM_FDIM] = f_atoms[b2a[1:]]
    f_bonds[1:, ATOM_FDIM:] = np.repeat(flat.bond_feats, 2, axis=0)

    # a2b lists INCOMING edges: the target of edge e is the source of its reverse.
    target = b2a[b2revb]
    target[0] = -1  # the padding edge is nobody's neighbour
    a2b = _incoming_edges(target, n_atoms, neighbour_width)
    return {
        "f_atoms": f_atoms,
        "f_bonds": f_bonds,
        "a2b": a2b,
        "b2a": b2a,
        "b2revb": b2revb,
        "a_scope": np.stack([atom_start, atom_counts], axis=1),
        "b_scope": np.stack([edge_start, edge_counts], axis=1),
        "a2a": b2a[a2b],
    }


def _incoming_edges(target: np.ndarray, n_atoms: int, min_width: int) -> np.ndarray:
    """[n_atoms, max(1, min_width, max in-degree)] int64: ascending incoming edge ids per atom, padded with 0."""
    real = np.flatnonzero(target >= 0)
    grouped = grouped_positions(target[real], n_atoms, fill=-1, min_width=max(1, min_width))
    a2b = np.zeros_like(grouped)
    filled = grouped >= 0
    a2b[filled] = real[grouped[filled]]
    return a2b


__all__ = ["collate_arrays", "collate_graphs"]
