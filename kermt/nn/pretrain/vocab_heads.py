"""GROVER vocab pretraining heads and loss: contextual atom / bond vocab and functional groups.

Upstream behaviour: docs/upstream-compatibility.md#pretraining.

Keys equal upstream's ``vocab_module.*``: ``av_task_{atom,bond}.linear``, ``bv_task_{atom,bond}.{linear,linear_rev}``,
``fg_task_all.readout.cached_zero_vector``, ``fg_task_all.linear_{atom_from_atom,...}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from kermt.config import ReadoutConfig
from kermt.data.batch import BatchMolGraph
from kermt.data.prefetch import transfer_fields
from kermt.nn.encoder import ALL_BRANCHES, EncoderOutput
from kermt.nn.readout import Readout, read_out_families



class AtomVocabHead(nn.Module):
    """Atom embeddings [A, hidden] -> log-probabilities over the atom vocab [A, V]."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, vocab_size)

    def forward(self, atoms: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.linear(atoms), dim=1)


class BondVocabHead(nn.Module):
    """Directed-bond embeddings [E, hidden] (E odd: padding row + pairs) -> log-probabilities per chemical bond
    [1 + (E-1)/2, V].

    Chemical bond k owns directed rows 2k-1 (a1->a2, through ``linear``) and 2k (a2->a1, through ``linear_rev``);
    output row 0 is the padding row through both, so labels line up with the bond labels' leading 0.
    """

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, vocab_size)
        self.linear_rev = nn.Linear(hidden_size, vocab_size)

    def forward(self, bonds: torch.Tensor) -> torch.Tensor:
        if bonds.shape[0] % 2 != 1:
            raise ValueError(f"expected an odd number of directed-bond rows (padding + pairs), got {bonds.shape[0]}")
        forward_rows = torch.cat([bonds[:1], bonds[1::2]])
        reverse_rows = bonds[0::2]
        return F.log_softmax(self.linear(forward_rows) + self.linear_rev(reverse_rows), dim=1)


class FunctionalGroupHead(nn.Module):
    """Mean readout of each embedding family, then one Linear per family -> functional-group logits [M, fg_size]."""

    def __init__(self, hidden_size: int, fg_size: int) -> None:
        super().__init__()
        self.readout = Readout(hidden_size, ReadoutConfig(self_attention=False))
        for name in ALL_BRANCHES:
            self.add_module(f"linear_{name}", nn.Linear(hidden_size, fg_size))

    def forward(self, embeddings: EncoderOutput, graph: BatchMolGraph) -> dict[str, torch.Tensor | None]:
        pooled = read_out_families(self.readout, embeddings, graph, ALL_BRANCHES)
        return {name: getattr(self, f"linear_{name}")(pooled[name]) if name in pooled else None
                for name in ALL_BRANCHES}


@dataclass(frozen=True)
class VocabPredictions:
    """Per family: atom-vocab log-probs [A, V_atom] (atom_*), bond-vocab log-probs [1+B, V_bond] (bond_*), and
    functional-group logits ``fg_*`` [M, fg_size]. Families the encoder did not produce are None."""

    atom_from_atom: torch.Tensor | None
    atom_from_bond: torch.Tensor | None
    bond_from_atom: torch.Tensor | None
    bond_from_bond: torch.Tensor | None
    fg_atom_from_atom: torch.Tensor | None
    fg_atom_from_bond: torch.Tensor | None
    fg_bond_from_atom: torch.Tensor | None
    fg_bond_from_bond: torch.Tensor | None


@dataclass(frozen=True)
class VocabTargets:
    """``atom`` [A] / ``bond`` [1+B] int64 vocab ids (0 = unlabelled, incl. the padding row); ``fg`` [M, fg_size]
    float 0/1 functional-group labels."""

    atom: torch.Tensor
    bond: torch.Tensor
    fg: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "VocabTargets":
        return transfer_fields(self, ("atom", "bond", "fg"), device, non_blocking)

    def pin_memory(self) -> "VocabTargets":
        return transfer_fields(self, ("atom", "bond", "fg"), None, False)


class VocabHeads(nn.Module):
    """Upstream's ``VocabPredictionModule``: the four vocab heads and the functional-group head."""

    def __init__(self, hidden_size: int, atom_vocab_size: int, bond_vocab_size: int, fg_size: int) -> None:
        super().__init__()
        self.av_task_atom = AtomVocabHead(hidden_size, atom_vocab_size)
        self.av_task_bond = AtomVocabHead(hidden_size, atom_vocab_size)
        self.bv_task_atom = BondVocabHead(hidden_size, bond_vocab_size)
        self.bv_task_bond = BondVocabHead(hidden_size, bond_vocab_size)
        self.fg_task_all = FunctionalGroupHead(hidden_size, fg_size)

    def forward(self, embeddings: EncoderOutput, graph: BatchMolGraph) -> VocabPredictions:
        def apply(head: nn.Module, rows: torch.Tensor | None) -> torch.Tensor | None:
            return None if rows is None else head(rows)

        fg = self.fg_task_all(embeddings, graph)
        return VocabPredictions(
            atom_from_atom=apply(self.av_task_atom, embeddings.atom_from_atom),
            atom_from_bond=apply(self.av_task_bond, embeddings.atom_from_bond),
            bond_from_atom=apply(self.bv_task_atom, embeddings.bond_from_atom),
            bond_from_bond=apply(self.bv_task_bond, embeddings.bond_from_bond),
            **{f"fg_{name}": fg[name] for name in ALL_BRANCHES},
        )


__all__ = [
    "AtomVocabHead",
    "BondVocabHead",
    "FunctionalGroupHead",
    "VocabHeads",
    "VocabPredictions",
    "VocabTargets",
]
