"""The encoder's neighbour sums as sparse matrices, built in numpy where the batch is collated.

Upstream sums over padded index lists: ``x[a2b].sum(1)`` gathers an [A, D, hidden] tensor (D = the batch's largest
in-degree) and every padding slot adds row 0. Each of those sums is a fixed linear map of the rows, so it is one
sparse matrix whose entries count how often a row is summed: padding slots included in "upstream" mode (column 0
holds the number of padding slots), left out in "zero" mode. The edge update ``Σ_{a2b[b2a[b]]} x − x[b2revb[b]]``
is one matrix with a 0 where the reverse bond cancels (exact, where upstream adds then subtracts).

Building them needs sorting and de-duplication, which on an accelerator means host synchronisations
(``coalesce``); here they are built on the CPU by the data loader, with their transposes for the backward, and
travel with the batch (:class:`~kermt.data.batch.GraphOperators`). Entries are ordered exactly as torch's
``coalesce`` orders them, so sums come out as they did when the model built the operators itself.

    incoming_bonds  [A, E]  Σ_{b ∈ a2b[a]} x[b]
    neighbour_atoms [A, A]  Σ_{w ∈ a2a[a]} x[w]
    bond_update     [E, E]  Σ_{a2b[b2a[b]]} x − x[b2revb[b]]
    atom_to_bond    [E, A]  for bond u->v: x[u] + Σ_{a2a[u]} x − x[v]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kermt.config import PADDING_MODES, PaddingMode
from kermt.data.batch import BatchMolGraph, GraphOperators, SparseOperator

OPERATOR_NAMES = ("incoming_bonds", "neighbour_atoms", "bond_update", "atom_to_bond")


@dataclass(frozen=True)
class OperatorSpec:
    """Which operators a model reads (``names``), for which padding mode, and whether with transposes (training)."""

    padding: PaddingMode
    names: tuple[str, ...]
    transposes: bool

    def __post_init__(self) -> None:
        if self.padding not in PADDING_MODES:
            raise ValueError(f"padding {self.padding!r} is not one of {PADDING_MODES}")
        unknown = set(self.names) - set(OPERATOR_NAMES)
        if unknown:
            raise ValueError(f"unknown operators {sorted(unknown)}; known: {OPERATOR_NAMES}")


@dataclass(frozen=True)
class _Triplets:
    """COO entries of one operator (duplicates allowed, summed when compressed)."""

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    shape: tuple[int, int]

    def __add__(self, other: "_Triplets") -> "_Triplets":
        return _Triplets(np.concatenate([self.rows, other.rows]), np.concatenate([self.cols, other.cols]),
                         np.concatenate([self.values, other.values]), self.shape)

    def transposed(self) -> "_Triplets":
        return _Triplets(self.cols, self.rows, self.values, (self.shape[1], self.shape[0]))

    def compressed(self) -> SparseOperator:
        """CSR with duplicates summed and columns ascending within each row (torch's coalesce order)."""
        n_rows, n_cols = self.shape
        keys, position = np.unique(self.rows * n_cols + self.cols, return_inverse=True)
        values = np.bincount(position, weights=self.values, minlength=len(keys)).astype(np.float32)
        crow = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys // n_cols, minlength=n_rows), out=crow[1:])
        parts = (crow, keys % n_cols, values)
        return SparseOperator(*(torch.from_numpy(np.ascontiguousarray(p)) for p in parts), self.shape)


def _padded_lists(index: np.ndarray, n_cols: int, padding: PaddingMode) -> _Triplets:
    """Sum row ``index[r, j]`` into row r for every slot j (padding slots, column 0, only in "upstream" mode)."""
    rows = np.repeat(np.arange(index.shape[0], dtype=np.int64), index.shape[1])
    cols = index.reshape(-1).astype(np.int64)
    if padding == "zero":
        keep = cols != 0
        rows, cols = rows[keep], cols[keep]
    return _Triplets(rows, cols, np.ones(len(rows)), (index.shape[0], n_cols))


def _minus(cols: np.ndarray, n_cols: int) -> _Triplets:
    """Subtract ``x[cols[r]]`` from row r."""
    rows = np.arange(len(cols), dtype=np.int64)
    return _Triplets(rows, cols.astype(np.int64), -np.ones(len(cols)), (len(cols), n_cols))


def _triplets(name: str, arrays: dict[str, np.ndarray], padding: PaddingMode) -> _Triplets:
    a2b, a2a, b2a, b2revb = arrays["a2b"], arrays["a2a"], arrays["b2a"], arrays["b2revb"]
    n_atoms, n_bonds = a2b.shape[0], b2a.shape[0]
    if name == "incoming_bonds":
        return _padded_lists(a2b, n_bonds, padding)
    if name == "neighbour_atoms":
        return _padded_lists(a2a, n_atoms, padding)
    if name == "bond_update":  # the source atom's incoming bonds, moved to every bond leaving it
        return _padded_lists(a2b[b2a], n_bonds, padding) + _minus(b2revb, n_bonds)
    around = np.concatenate([b2a[:, None], a2a[b2a]], axis=1)  # atom_to_bond: the source atom and its neighbours
    return _padded_lists(around, n_atoms, padding) + _minus(b2a[b2revb], n_atoms)


def build_operators(arrays: dict[str, np.ndarray], spec: OperatorSpec) -> GraphOperators:
    """The operators ``spec`` names for a batch given as numpy arrays (a2b, a2a, b2a, b2revb)."""
    matrices, transposes = {}, {}
    for name in spec.names:
        triplets = _triplets(name, arrays, spec.padding)
        matrices[name] = triplets.compressed()
        if spec.transposes:
            transposes[name] = triplets.transposed().compressed()
    return GraphOperators(spec.padding, matrices, transposes)


def operators_of(graph: BatchMolGraph, spec: OperatorSpec) -> GraphOperators:
    """:func:`build_operators` for an already collated batch, wherever it lives (the arrays visit the host)."""
    arrays = {name: getattr(graph, name).cpu().numpy() for name in ("a2b", "a2a", "b2a", "b2revb")}
    operators = build_operators(arrays, spec)
    return operators if graph.f_atoms.device.type == "cpu" else operators.to(graph.f_atoms.device)
