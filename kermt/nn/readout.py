"""Molecule readout: mean or structured self-attention over each molecule's rows, vectorised.

Upstream behaviour: docs/upstream-compatibility.md#readout.

Rows of all molecules are scattered into a padded [M, N_max, hidden] tensor with a mask, so both readouts are a
few batched tensor ops instead of upstream's Python loop over molecules (numerically equal to 1e-6). Several
views of the same rows (the finetune model's two) are read out as one stack: one gather, one attention.
Keys: ``cached_zero_vector`` [hidden] (a non-trainable parameter, as upstream), ``attn.w1``, ``attn.w2``.
"""

from __future__ import annotations

import torch
from torch import nn

from kermt.config import ReadoutConfig
from kermt.data.batch import BatchMolGraph
from kermt.nn.encoder import ALL_BRANCHES, ATOM_BRANCHES, BOND_BRANCHES, EncoderOutput


class SelfAttention(nn.Module):
    """Scores ``w2 · tanh(w1 · xᵀ)`` per row: w1 [attn_hidden, hidden], w2 [attn_out, attn_hidden]."""

    def __init__(self, hidden: int, attn_hidden: int, attn_out: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(attn_hidden, hidden))
        self.w2 = nn.Parameter(torch.empty(attn_out, attn_hidden))
        nn.init.xavier_normal_(self.w1)
        nn.init.xavier_normal_(self.w2)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., hidden] -> unnormalised attention scores [..., attn_out]."""
        return torch.matmul(torch.tanh(torch.matmul(x, self.w1.t())), self.w2.t())


def pad_by_scope(
    rows: torch.Tensor, scope: torch.Tensor, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather each molecule's rows into [..., M, N_max, hidden] (zeros beyond a molecule's size) and a mask
    [M, N_max]; ``rows`` is [R, hidden] or a stack [..., R, hidden] of views of the same rows.

    ``scope`` [M, 2] holds (first row, row count) per molecule; ``width`` is N_max if the caller knows it (the
    batch's ``max_atoms``/``max_bonds``), else it is read from ``scope``: a host synchronisation on a device.
    """
    starts, sizes = scope[:, 0], scope[:, 1]
    if width is None:
        width = int(sizes.max()) if sizes.numel() else 0
    positions = torch.arange(width, device=rows.device)
    mask = positions.unsqueeze(0) < sizes.unsqueeze(1)
    row_ids = torch.where(mask, starts.unsqueeze(1) + positions.unsqueeze(0), torch.zeros_like(mask, dtype=torch.long))
    padded = rows.index_select(-2, row_ids.reshape(-1)).unflatten(-2, mask.shape)
    return padded * mask.unsqueeze(-1).to(rows.dtype), mask


class Readout(nn.Module):
    """Molecule vectors from row embeddings: [R, hidden] + scope [M, 2] -> [M, hidden] or [M, hidden·attn_out]."""

    def __init__(self, hidden_size: int, config: ReadoutConfig) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.config = config
        self.cached_zero_vector = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        if config.self_attention:
            self.attn = SelfAttention(hidden_size, config.attn_hidden, config.attn_out)

    @property
    def output_size(self) -> int:
        return self.config.output_size(self.hidden_size)

    def forward(self, rows: torch.Tensor, scope: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """rows [R, hidden] -> [M, output_size], or a stack [V, R, hidden] of V views of the same rows (same
        scope) -> [V, M, output_size] in one pass. ``width``: the largest molecule's row count, if known (see
        :func:`pad_by_scope`)."""
        padded, mask = pad_by_scope(rows, scope, width)  # [..., M, N, hidden], [M, N]
        if self.config.self_attention:
            scores = self.attn.scores(padded).masked_fill(~mask.unsqueeze(-1), float("-inf"))  # [..., M, N, out]
            weights = torch.softmax(scores, dim=-2).nan_to_num(0.0)  # empty molecules: all -inf -> NaN -> 0
            return torch.matmul(weights.transpose(-1, -2), padded).flatten(-2)  # [..., M, attn_out * hidden]
        sizes = mask.sum(dim=1)
        mean = padded.sum(dim=-2) / sizes.clamp(min=1).unsqueeze(1).to(rows.dtype)
        empty = (sizes == 0).unsqueeze(1)
        return torch.where(empty, self.cached_zero_vector.unsqueeze(0), mean)


def read_out_families(
    readout: Readout, embeddings: EncoderOutput, graph: BatchMolGraph, names: tuple[str, ...] = ALL_BRANCHES
) -> dict[str, torch.Tensor]:
    """{family: [M, readout size]} for each of ``names`` that the encoder built (in ``names``' order): atom
    families over the atom scope, bond families over the bond scope, the families of one kind as one stack."""
    pooled = {}
    for kind, scope, width in ((ATOM_BRANCHES, graph.a_scope, graph.max_atoms),
                               (BOND_BRANCHES, graph.b_scope, graph.max_bonds)):
        built = [name for name in names if name in kind and getattr(embeddings, name) is not None]
        if built:
            stack = torch.stack([getattr(embeddings, name) for name in built])
            pooled.update(zip(built, readout(stack, scope, width).unbind(0)))
    return {name: pooled[name] for name in names if name in pooled}
