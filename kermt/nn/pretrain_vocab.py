"""GROVER vocab pretraining heads and loss: contextual atom / bond vocab and functional groups.

Upstream behaviour: docs/upstream-compatibility.md#pretraining.

Keys equal upstream's ``vocab_module.*``: ``av_task_{atom,bond}.linear``, ``bv_task_{atom,bond}.{linear,linear_rev}``,
``fg_task_all.readout.cached_zero_vector``, ``fg_task_all.linear_{atom_from_atom,...}``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn
from torch.nn import functional as F

from kermt.config import ReadoutConfig
from kermt.data.batch import BatchMolGraph
from kermt.data.prefetch import transfer_fields
from kermt.losses import connected_zero
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


@dataclass(frozen=True)
class VocabLoss:
    """Upstream's seven logged values: total = av + bv + fg + dist_coff·(av_dist + bv_dist) + fg_dist."""

    total: torch.Tensor
    av: torch.Tensor
    bv: torch.Tensor
    fg: torch.Tensor
    av_dist: torch.Tensor
    bv_dist: torch.Tensor
    fg_dist: torch.Tensor

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        """Values in upstream's order (overall, av, bv, fg, av_dist, bv_dist, fg_dist)."""
        return tuple(getattr(self, f.name) for f in fields(self))


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


def _labelled_nll(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean NLL over labelled rows (label 0 ignored), as a sum over a clamped count: no host sync, and 0 rather than
    upstream's NaN when nothing is labelled (e.g. a batch of bond-free molecules) — our only departure from it."""
    total = F.nll_loss(log_probs, labels, ignore_index=0, reduction="sum")
    return total / (labels != 0).sum().clamp(min=1).to(total.dtype)


def _pair_terms(
    first: torch.Tensor | None,
    second: torch.Tensor | None,
    fg_first: torch.Tensor | None,
    fg_second: torch.Tensor | None,
    labels: torch.Tensor,
    fg_labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(vocab NLL, fg BCE, vocab disagreement, fg disagreement) of one pair of families (atom_* or bond_*)."""
    zero = fg_labels.new_zeros(())
    nll, bce, dist, fg_dist = zero, zero, zero, zero
    for log_probs, fg_logits in ((first, fg_first), (second, fg_second)):
        if log_probs is not None:
            nll = nll + _labelled_nll(log_probs, labels)
            bce = bce + F.binary_cross_entropy_with_logits(fg_logits, fg_labels)
    if first is not None and second is not None:
        dist = F.mse_loss(first, second)  # over ALL rows, on log-probabilities
        fg_dist = F.mse_loss(torch.sigmoid(fg_first), torch.sigmoid(fg_second))
    return nll, bce, dist, fg_dist


def vocab_loss(preds: VocabPredictions, targets: VocabTargets, dist_coff: float = 0.1) -> VocabLoss:
    """Upstream's ``VocabPredictionModule.compute_loss``; ``fg_dist`` is deliberately not scaled (as upstream, see
    docs/upstream-compatibility.md#pretraining).

    A batch without molecules (a worker's empty share) has every term 0: otherwise the fg means would be NaN and the
    disagreement terms would score the padding row alone.
    """
    fg_labels = targets.fg.to(_preds_dtype(preds))
    if fg_labels.shape[0] == 0:
        zero = connected_zero(*(getattr(preds, f.name) for f in fields(preds)))
        return VocabLoss(total=zero, av=zero, bv=zero, fg=zero, av_dist=zero, bv_dist=zero, fg_dist=zero)
    av, fg_atom, av_dist, fg_atom_dist = _pair_terms(
        preds.atom_from_atom, preds.atom_from_bond, preds.fg_atom_from_atom, preds.fg_atom_from_bond,
        targets.atom, fg_labels,
    )
    bv, fg_bond, bv_dist, fg_bond_dist = _pair_terms(
        preds.bond_from_atom, preds.bond_from_bond, preds.fg_bond_from_atom, preds.fg_bond_from_bond,
        targets.bond, fg_labels,
    )
    fg, fg_dist = fg_atom + fg_bond, fg_atom_dist + fg_bond_dist
    total = av + bv + fg + dist_coff * av_dist + dist_coff * bv_dist + fg_dist
    return VocabLoss(total=total, av=av, bv=bv, fg=fg, av_dist=av_dist, bv_dist=bv_dist, fg_dist=fg_dist)


def _preds_dtype(preds: VocabPredictions) -> torch.dtype:
    """Floating dtype of the predictions (float32 unless the model runs in another precision)."""
    for f in fields(preds):
        value = getattr(preds, f.name)
        if value is not None:
            return value.dtype
    raise ValueError("VocabPredictions holds no tensors: the encoder produced no embedding family")


__all__ = [
    "AtomVocabHead",
    "BondVocabHead",
    "FunctionalGroupHead",
    "VocabHeads",
    "VocabLoss",
    "VocabPredictions",
    "VocabTargets",
    "vocab_loss",
]
