"""Neighbour sums over a :class:`~kermt.data.batch.BatchMolGraph`, as segment sums.

Upstream sums over padded index lists: ``x[a2b].sum(1)`` gathers an [A, D, hidden] tensor (D = the batch's maximum
in-degree) and every padding slot adds row 0. We sum only over the real neighbours (one ``index_add``) and, in
"upstream" padding mode, add ``(D - degree) * x[0]`` — the same number, without materialising the padded gather
(D is 6 for many batches while the mean degree is about 2).

All functions take messages with rows on dimension -2, so a stack of encoders ``[K, R, hidden]`` is summed in one
call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kermt.config import PaddingMode
from kermt.data.batch import BatchMolGraph


@dataclass(frozen=True)
class GraphIndex:
    """Index tensors derived once per batch.

    Shapes (A atoms incl. padding row, E directed bonds incl. padding row, N = E - 1 real directed bonds):
        b2a, b2revb       [E]   as in BatchMolGraph
        in_atom           [N]   the atom each real directed bond points to (the row of a2b that lists it)
        in_bond           [N]   the bond id (so ``a2b[in_atom[i]]`` contains ``in_bond[i]``)
        in_source         [N]   b2a[in_bond]: the neighbour atom of ``in_atom`` along that bond
        padding_slots     [A, 1] float: D - degree, the number of padding slots of each atom's a2b row
        num_atoms         A
        padding           "upstream" (padding slots add row 0) or "zero" (row 0 is kept at zero)
    """

    b2a: torch.Tensor
    b2revb: torch.Tensor
    in_atom: torch.Tensor
    in_bond: torch.Tensor
    in_source: torch.Tensor
    padding_slots: torch.Tensor
    num_atoms: int
    padding: PaddingMode

    @classmethod
    def from_batch(cls, graph: BatchMolGraph, padding: PaddingMode, dtype: torch.dtype) -> "GraphIndex":
        a2b = graph.a2b
        real = a2b != 0
        in_atom, slot = real.nonzero(as_tuple=True)  # row-major: each atom's neighbours in a2b order
        in_bond = a2b[in_atom, slot]
        slots = (a2b.shape[1] - real.sum(dim=1, keepdim=True)).to(dtype)
        return cls(
            b2a=graph.b2a,
            b2revb=graph.b2revb,
            in_atom=in_atom,
            in_bond=in_bond,
            in_source=graph.b2a[in_bond],
            padding_slots=slots,
            num_atoms=int(a2b.shape[0]),
            padding=padding,
        )

    def _segment_sum(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Sum ``x[..., rows[i], :]`` into atom ``in_atom[i]``; add the padding slots' row-0 share if upstream."""
        out_shape = (*x.shape[:-2], self.num_atoms, x.shape[-1])
        gathered = x.index_select(-2, rows)
        total = x.new_zeros(out_shape).index_add(-2, self.in_atom, gathered)
        if self.padding == "upstream":
            total = total + self.padding_slots * x[..., :1, :]
        return total

    def sum_incoming_bonds(self, bond_x: torch.Tensor) -> torch.Tensor:
        """``Σ_{b ∈ a2b[a]} bond_x[b]`` for every atom a: [..., E, h] -> [..., A, h]."""
        return self._segment_sum(bond_x, self.in_bond)

    def sum_neighbour_atoms(self, atom_x: torch.Tensor) -> torch.Tensor:
        """``Σ_{w ∈ a2a[a]} atom_x[w]`` for every atom a: [..., A, h] -> [..., A, h]."""
        return self._segment_sum(atom_x, self.in_source)

    def bond_messages(self, bond_x: torch.Tensor) -> torch.Tensor:
        """Directed-bond update ``Σ_{a2b[b2a[b]]} bond_x − bond_x[b2revb[b]]``: [..., E, h] -> [..., E, h]."""
        into_source = self.sum_incoming_bonds(bond_x).index_select(-2, self.b2a)
        return into_source - bond_x.index_select(-2, self.b2revb)

    def atom_to_bond_messages(self, atom_x: torch.Tensor) -> torch.Tensor:
        """For bond u->v: ``atom_x[u] + Σ_{w ∈ a2a[u]} atom_x[w] − atom_x[v]``: [A, h] -> [E, h]."""
        around_source = (atom_x + self.sum_neighbour_atoms(atom_x)).index_select(-2, self.b2a)
        return around_source - atom_x.index_select(-2, self.b2a.index_select(0, self.b2revb))

    def zero_padding_row(self, x: torch.Tensor) -> torch.Tensor:
        """In "zero" mode, return ``x`` with row 0 (dimension -2) set to zero; in "upstream" mode, ``x`` itself."""
        if self.padding == "upstream":
            return x
        keep = torch.ones(x.shape[-2], 1, dtype=x.dtype, device=x.device)
        keep[0] = 0
        return x * keep
