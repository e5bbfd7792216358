"""Building blocks of the cMIM SMILES decoder: rotary and sinusoidal positions, the RoPE decoder layer.

Upstream behaviour: docs/upstream-compatibility.md#pretraining.

Keys equal upstream's: ``rope.inv_freq`` (a saved buffer), ``self_attn_{q,k,v,out}``, ``cross_attn_{q,k,v,out}``,
optional ``self_attn_gate`` / ``cross_attn_gate``, ``linear1``, ``linear2``, ``norm1..3``; ``pos_encoder.pe``.
Every dropout keys its rows by molecule (tensors [B, ...]); with per-molecule draws the attention is computed
explicitly so that its weights' mask is drawn per molecule too (scaled_dot_product_attention draws from torch's RNG).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from kermt.nn import keyed_dropout
from kermt.nn.keyed_dropout import Dropout


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, "rotate-half" convention, base 10000.

    Position p rotates the pair (x[i], x[i + d/2]) by angle p·θ_i, θ_i = base^(-2i/d). The angles are recomputed
    from ``inv_freq`` each call (a [L, d/2] outer product), so there is no cache to keep on the right device.
    """

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head dimension, got {head_dim}")
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, L, heads, head_dim] -> same shape, rotated by position along dim 1."""
        positions = torch.arange(x.shape[1], device=x.device, dtype=self.inv_freq.dtype)
        angles = torch.outer(positions, self.inv_freq)[None, :, None, :]  # [1, L, 1, d/2]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class SinusoidalPositionalEncoding(nn.Module):
    """Additive sine/cosine positions (``pe`` buffer [max_len, 1, d], kept in upstream's layout), then dropout."""

    def __init__(self, d_model: int, dropout: float, max_len: int) -> None:
        super().__init__()
        self.dropout = Dropout(dropout, "molecule")
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, L, d] -> x + pe[:L]."""
        return self.dropout(x + self.pe[: x.shape[1], 0, :])


class RopeDecoderLayer(nn.Module):
    """Post-norm decoder layer: RoPE causal self-attention, cross-attention to the memory, ReLU FFN.

    Each sublayer: ``x = LayerNorm(x + dropout(sublayer(x)))``. An optional gate multiplies the concatenated head
    outputs by ``σ(W_gate · x)`` before the output projection (x = the sublayer's input).
    """

    def __init__(
        self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, gate_self: bool, gate_cross: bool
    ) -> None:
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"d_model {d_model} must be divisible by nhead {nhead}")
        self.nhead = nhead
        self.dropout_p = dropout
        self.rope = RotaryEmbedding(d_model // nhead)
        for part in ("q", "k", "v", "out"):
            self.add_module(f"self_attn_{part}", nn.Linear(d_model, d_model))
        for part in ("q", "k", "v", "out"):
            self.add_module(f"cross_attn_{part}", nn.Linear(d_model, d_model))
        self.self_attn_gate = nn.Linear(d_model, d_model) if gate_self else None
        self.cross_attn_gate = nn.Linear(d_model, d_model) if gate_cross else None
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout, "molecule")

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, d] -> [B, L, heads, d/heads]."""
        return x.unflatten(-1, (self.nhead, -1))

    def _attend(
        self, prefix: str, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None, rope: bool
    ) -> torch.Tensor:
        """Multi-head attention of ``x`` [B, Lq, d] over ``memory`` [B, Lk, d]; ``mask`` is boolean, True = may
        attend, broadcastable to [B, heads, Lq, Lk]."""
        q = self._heads(getattr(self, f"{prefix}_q")(x))
        k = self._heads(getattr(self, f"{prefix}_k")(memory))
        v = self._heads(getattr(self, f"{prefix}_v")(memory))
        if rope:
            q, k = self.rope(q), self.rope(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        dropout_p = self.dropout_p if self.training else 0.0
        if dropout_p > 0 and keyed_dropout.active_draws() is not None:  # the weights' mask drawn per molecule
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = keyed_dropout.dropout(torch.softmax(scores, dim=-1), dropout_p, True, "molecule")
            attended = weights @ v
        else:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        attended = attended.transpose(1, 2).flatten(2)  # [B, Lq, d]
        gate = getattr(self, f"{prefix}_gate")
        if gate is not None:
            attended = attended * torch.sigmoid(gate(x))
        return getattr(self, f"{prefix}_out")(attended)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, self_mask: torch.Tensor) -> torch.Tensor:
        """x [B, L, d], memory [B, M, d], self_mask [B, 1, L, L] bool (causal and key padding) -> [B, L, d]."""
        x = self.norm1(x + self.dropout(self._attend("self_attn", x, x, self_mask, rope=True)))
        x = self.norm2(x + self.dropout(self._attend("cross_attn", x, memory, None, rope=False)))
        feed_forward = self.linear2(self.dropout(F.relu(self.linear1(x))))
        return self.norm3(x + self.dropout(feed_forward))


__all__ = ["RopeDecoderLayer", "RotaryEmbedding", "SinusoidalPositionalEncoding"]
