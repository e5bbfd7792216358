"""Named batch types: one disjoint graph per batch in upstream KERMT's layout.

Row 0 of the atom and directed-bond arrays is an all-zero padding row; molecule ``i``'s atoms occupy rows
``a_scope[i, 0] : a_scope[i, 0] + a_scope[i, 1]`` (starts at 1). Index arrays use 0 for "no neighbour".

A batch can also carry what the model would otherwise have to derive on the device with host round trips: the
neighbour-sum operators as ready CSR arrays (:class:`GraphOperators`, built in numpy by the data loader) and the
largest molecule's row counts (plain ints the readout needs for its padded width).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from kermt.data.prefetch import transfer

# The index and feature arrays, in upstream's order (``components()``).
GRAPH_ARRAYS = ("f_atoms", "f_bonds", "a2b", "b2a", "b2revb", "a_scope", "b_scope", "a2a")


@dataclass(frozen=True)
class SparseOperator:
    """A constant sparse matrix [rows, cols] as CSR arrays (duplicates already summed, columns ascending per row).

    crow [rows + 1] int64, col [nnz] int64, values [nnz] float32; ``shape`` is a host value, so building the
    torch CSR tensor from these arrays needs nothing from the device.
    """

    crow: torch.Tensor
    col: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, int]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "SparseOperator":
        return self._moved(device, non_blocking)

    def pin_memory(self) -> "SparseOperator":
        return self._moved(None, False)

    def _moved(self, device: torch.device | str | None, non_blocking: bool) -> "SparseOperator":
        crow, col, values = (transfer(t, device, non_blocking) for t in (self.crow, self.col, self.values))
        return SparseOperator(crow, col, values, self.shape)

    def matrix(self, dtype: torch.dtype) -> torch.Tensor:
        """The sparse CSR tensor (values in ``dtype``)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return torch.sparse_csr_tensor(self.crow, self.col, self.values.to(dtype), self.shape,
                                           device=self.crow.device, check_invariants=False)


@dataclass(frozen=True)
class GraphOperators:
    """Neighbour-sum operators of one batch for one padding mode (see :mod:`kermt.data.operators`).

    matrices    name -> operator ("incoming_bonds", "neighbour_atoms", "bond_update", "atom_to_bond")
    transposes  name -> the operator's transpose, for the backward (empty for batches that are only predicted)
    """

    padding: str
    matrices: Mapping[str, SparseOperator]
    transposes: Mapping[str, SparseOperator]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "GraphOperators":
        return self._moved(device, non_blocking)

    def pin_memory(self) -> "GraphOperators":
        return self._moved(None, False)

    def _moved(self, device: torch.device | str | None, non_blocking: bool) -> "GraphOperators":
        return GraphOperators(
            self.padding,
            {name: transfer(op, device, non_blocking) for name, op in self.matrices.items()},
            {name: transfer(op, device, non_blocking) for name, op in self.transposes.items()},
        )


@dataclass(frozen=True)
class BatchMolGraph:
    """A batch of molecules as one graph (docs/upstream-compatibility.md#batch-graph).

    Shapes (A = 1 + total atoms, E = 1 + total directed bonds, M = molecules, D = max in-degree, at least 1):
        f_atoms  [A, 151] float32  atom features, row 0 zeros
        f_bonds  [E, 165] float32  concat(source atom features, bond features), row 0 zeros
        a2b      [A, D]   int64    incoming directed-bond ids of each atom, padded with 0
        b2a      [E]      int64    source atom of each directed bond (b2a[0] = 0)
        b2revb   [E]      int64    id of the reverse directed bond (b2revb[0] = 0)
        a_scope  [M, 2]   int64    (first atom row, atom count) per molecule
        b_scope  [M, 2]   int64    (first bond row, directed-bond count) per molecule
        a2a      [A, D]   int64    b2a[a2b]: neighbour atom ids, padded with 0
    Optional, filled by the collate (None: derived from the arrays when needed, with a host round trip):
        operators                  GraphOperators for the model's padding mode
        max_atoms, max_bonds       int: the largest a_scope[:, 1] and b_scope[:, 1] (0 without molecules)
        molecule_ids     [M] int64 each molecule's id in its dataset or corpus (set by whoever picks the rows): the
                         key of per-molecule dropout draws (kermt.nn.keyed_dropout)
    """

    f_atoms: torch.Tensor
    f_bonds: torch.Tensor
    a2b: torch.Tensor
    b2a: torch.Tensor
    b2revb: torch.Tensor
    a_scope: torch.Tensor
    b_scope: torch.Tensor
    a2a: torch.Tensor
    operators: GraphOperators | None = None
    max_atoms: int | None = None
    max_bonds: int | None = None
    molecule_ids: torch.Tensor | None = None

    @property
    def num_molecules(self) -> int:
        return int(self.a_scope.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "BatchMolGraph":
        """The batch on ``device``; ``non_blocking`` copies asynchronously (from pinned memory, see
        :meth:`pin_memory`)."""
        return self._moved(device, non_blocking)

    def pin_memory(self) -> "BatchMolGraph":
        """The batch in page-locked host memory, so that ``to(cuda, non_blocking=True)`` overlaps the copy."""
        return self._moved(None, False)

    def _moved(self, device: torch.device | str | None, non_blocking: bool) -> "BatchMolGraph":
        parts = {name: transfer(getattr(self, name), device, non_blocking)
                 for name in (*GRAPH_ARRAYS, "operators", "molecule_ids")}
        return replace(self, **parts)

    def components(self) -> tuple[torch.Tensor, ...]:
        """The tuple upstream's encoder consumes, in upstream's order."""
        return tuple(getattr(self, name) for name in GRAPH_ARRAYS)
