"""Neighbour sums over a :class:`~kermt.data.batch.BatchMolGraph` as sparse matrix products.

Upstream sums over padded index lists: ``x[a2b].sum(1)`` gathers an [A, D, hidden] tensor (D = the batch's maximum
in-degree, often 6 while the mean degree is about 2) and every padding slot adds row 0. Each neighbour sum used by
the encoder is a fixed linear map of the rows, so we build it once per batch as a sparse CSR matrix whose entries
count how often each row is summed — padding slots included in "upstream" mode (they add row 0, so column 0
holds the number of padding slots), excluded in "zero" mode. The edge update ``Σ_{a2b[b2a[b]]} x − x[b2revb[b]]``
becomes one matrix with a 0 where the reverse bond cancels (exact, where upstream adds then subtracts).

Each operator's transpose (for the backward) is built once per batch too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from kermt.config import PADDING_MODES, PaddingMode
from kermt.data.batch import BatchMolGraph


def _csr(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A coalesced (duplicates summed) CSR matrix from COO triplets."""
    coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), values, shape, check_invariants=False).coalesce()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return coo.to_sparse_csr()


class _ConstantSparseProduct(torch.autograd.Function):
    """``operator @ x`` for a constant sparse ``operator``, differentiating with a precomputed transpose.

    torch's own backward transposes the CSR matrix (a sort) at every call; the operators are fixed for a batch.
    """

    @staticmethod
    def forward(ctx, operator: torch.Tensor, transposed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.transposed = transposed
        return torch.sparse.mm(operator, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, None, torch.sparse.mm(ctx.transposed, grad)


def _transpose(operator: torch.Tensor) -> torch.Tensor:
    coo = operator.to_sparse_coo().coalesce()
    rows, cols = coo.indices()
    return _csr(cols, rows, coo.values(), (operator.shape[1], operator.shape[0]))


def _padded_lists(index: torch.Tensor, dtype: torch.dtype, padding: PaddingMode) -> tuple[torch.Tensor, ...]:
    """COO triplets summing row ``index[r, j]`` into row r for every slot j (padding slot 0 only if upstream)."""
    rows = torch.arange(index.shape[0], device=index.device).repeat_interleave(index.shape[1])
    cols = index.reshape(-1)
    if padding == "zero":  # the same test as GraphIndex.zero_padding_row
        keep = cols != 0
        rows, cols = rows[keep], cols[keep]
    return rows, cols, torch.ones(rows.shape[0], dtype=dtype, device=index.device)


@dataclass(frozen=True)
class GraphIndex:
    """The batch's neighbour-sum operators (sparse CSR, built once per batch).

    incoming_bonds  [A, E]  Σ_{b ∈ a2b[a]} x[b]
    neighbour_atoms [A, A]  Σ_{w ∈ a2a[a]} x[w]
    bond_update     [E, E]  Σ_{a2b[b2a[b]]} x − x[b2revb[b]]
    atom_to_bond    [E, A]  for bond u->v: x[u] + Σ_{a2a[u]} x − x[v]
    """

    incoming_bonds: torch.Tensor
    neighbour_atoms: torch.Tensor
    bond_update: torch.Tensor
    atom_to_bond: torch.Tensor
    padding: PaddingMode
    _transposed: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_batch(cls, graph: BatchMolGraph, padding: PaddingMode, dtype: torch.dtype) -> "GraphIndex":
        if padding not in PADDING_MODES:
            raise ValueError(f"padding {padding!r} is not one of {PADDING_MODES}")
        n_atoms, n_bonds = graph.f_atoms.shape[0], graph.f_bonds.shape[0]
        b2a, b2revb = graph.b2a, graph.b2revb
        bond_rows, bond_cols, bond_vals = _padded_lists(graph.a2b, dtype, padding)
        atom_rows, atom_cols, atom_vals = _padded_lists(graph.a2a, dtype, padding)
        # bond update: rows of the source atom's incoming-bond list, moved to every bond leaving that atom
        update_rows, update_cols, update_vals = _padded_lists(graph.a2b.index_select(0, b2a), dtype, padding)
        around_rows, around_cols, around_vals = _padded_lists(
            torch.cat([b2a.unsqueeze(1), graph.a2a.index_select(0, b2a)], dim=1), dtype, padding
        )
        every_bond = torch.arange(n_bonds, device=b2a.device)
        minus_one = -torch.ones(n_bonds, dtype=dtype, device=b2a.device)
        return cls(
            incoming_bonds=_csr(bond_rows, bond_cols, bond_vals, (n_atoms, n_bonds)),
            neighbour_atoms=_csr(atom_rows, atom_cols, atom_vals, (n_atoms, n_atoms)),
            bond_update=_csr(
                torch.cat([update_rows, every_bond]), torch.cat([update_cols, b2revb]),
                torch.cat([update_vals, minus_one]), (n_bonds, n_bonds),
            ),
            atom_to_bond=_csr(
                torch.cat([around_rows, every_bond]), torch.cat([around_cols, b2a.index_select(0, b2revb)]),
                torch.cat([around_vals, minus_one]), (n_bonds, n_atoms),
            ),
            padding=padding,
        )

    def apply(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Operator ``name`` applied to the rows of ``x``: [R_in, h] -> [R_out, h]."""
        operator = getattr(self, name)
        if not torch.is_grad_enabled() or not x.requires_grad:
            return torch.sparse.mm(operator, x)
        if name not in self._transposed:
            self._transposed[name] = _transpose(operator)
        return _ConstantSparseProduct.apply(operator, self._transposed[name], x)

    def sum_incoming_bonds(self, bond_x: torch.Tensor) -> torch.Tensor:
        """``Σ_{b ∈ a2b[a]} bond_x[b]`` for every atom a."""
        return self.apply("incoming_bonds", bond_x)

    def sum_neighbour_atoms(self, atom_x: torch.Tensor) -> torch.Tensor:
        """``Σ_{w ∈ a2a[a]} atom_x[w]`` for every atom a."""
        return self.apply("neighbour_atoms", atom_x)

    def bond_messages(self, bond_x: torch.Tensor) -> torch.Tensor:
        """Directed-bond update ``Σ_{a2b[b2a[b]]} bond_x − bond_x[b2revb[b]]``."""
        return self.apply("bond_update", bond_x)

    def atom_to_bond_messages(self, atom_x: torch.Tensor) -> torch.Tensor:
        """For bond u->v: ``atom_x[u] + Σ_{w ∈ a2a[u]} atom_x[w] − atom_x[v]``."""
        return self.apply("atom_to_bond", atom_x)

    def zero_padding_row(self, x: torch.Tensor) -> torch.Tensor:
        """In "zero" mode, return ``x`` with row 0 (dimension -2) set to zero; in "upstream" mode, ``x`` itself."""
        if self.padding != "zero":  # the same test as _padded_lists: "zero" is the one mode that changes sums
            return x
        keep = torch.ones(x.shape[-2], 1, dtype=x.dtype, device=x.device)
        keep[0] = 0
        return x * keep
