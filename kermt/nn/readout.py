"""Molecule readout: mean or structured self-attention over each molecule's rows, vectorised.

Upstream behaviour: docs/upstream-compatibility.md#readout.

Rows of all molecules are scattered into a padded [M, N_max, hidden] tensor with a mask, so both readouts are a
few batched tensor ops instead of upstream's Python loop over molecules (numerically equal to 1e-6).
Keys: ``cached_zero_vector`` [hidden] (a non-trainable parameter, as upstream), ``attn.w1``, ``attn.w2``.
"""

from __future__ import annotations

import torch
from torch import nn

from kermt.config import ReadoutConfig


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
    """Gather each molecule's rows into [M, N_max, hidden] (zeros beyond a molecule's size) and a mask [M, N_max].

    ``scope`` [M, 2] holds (first row, row count) per molecule; ``width`` is N_max if the caller knows it (the
    batch's ``max_atoms``/``max_bonds``), else it is read from ``scope``: a host synchronisation on a device.
    """
    starts, sizes = scope[:, 0], scope[:, 1]
    if width is None:
        width = int(sizes.max()) if sizes.numel() else 0
    positions = torch.arange(width, device=rows.device)
    mask = positions.unsqueeze(0) < sizes.unsqueeze(1)
    row_ids = torch.where(mask, starts.unsqueeze(1) + positions.unsqueeze(0), torch.zeros_like(mask, dtype=torch.long))
    padded = rows.index_select(0, row_ids.reshape(-1)).view(*mask.shape, rows.shape[1])
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
        """``width``: the largest molecule's row count, if known (see :func:`pad_by_scope`)."""
        padded, mask = pad_by_scope(rows, scope, width)
        sizes = mask.sum(dim=1)
        if self.config.self_attention:
            scores = self.attn.scores(padded).masked_fill(~mask.unsqueeze(-1), float("-inf"))  # [M, N, out]
            weights = torch.softmax(scores, dim=1).nan_to_num(0.0)  # empty molecules: all -inf -> NaN -> 0
            pooled = torch.bmm(weights.transpose(1, 2), padded).flatten(1)  # [M, attn_out * hidden]
            return pooled
        mean = padded.sum(dim=1) / sizes.clamp(min=1).unsqueeze(1).to(rows.dtype)
        empty = (sizes == 0).unsqueeze(1)
        return torch.where(empty, self.cached_zero_vector.unsqueeze(0), mean)
