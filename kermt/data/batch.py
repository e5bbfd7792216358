"""Named batch types: one disjoint graph per batch in upstream KERMT's layout.

Row 0 of the atom and directed-bond arrays is an all-zero padding row; molecule ``i``'s atoms occupy rows
``a_scope[i, 0] : a_scope[i, 0] + a_scope[i, 1]`` (starts at 1). Index arrays use 0 for "no neighbour".
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch


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
    """

    f_atoms: torch.Tensor
    f_bonds: torch.Tensor
    a2b: torch.Tensor
    b2a: torch.Tensor
    b2revb: torch.Tensor
    a_scope: torch.Tensor
    b_scope: torch.Tensor
    a2a: torch.Tensor

    @property
    def num_molecules(self) -> int:
        return int(self.a_scope.shape[0])

    def to(self, device: torch.device | str) -> "BatchMolGraph":
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def components(self) -> tuple[torch.Tensor, ...]:
        """The tuple upstream's encoder consumes, in upstream's order."""
        return tuple(getattr(self, f.name) for f in fields(self))
