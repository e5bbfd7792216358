"""Small layers shared by the encoder and the heads, named so that state_dict keys equal upstream's.

Every module here is parameter-compatible with its upstream counterpart: same attribute names, same shapes,
same order of registration (so ``state_dict()`` lists keys in upstream's order too). Each dropout knows the kind of
rows it acts on (``rows``: "atom" or "bond"), so it can draw per molecule (:mod:`kermt.nn.keyed_dropout`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from kermt.nn.keyed_dropout import Dropout
from kermt.registry import ACTIVATIONS

# One module factory per name of kermt.registry.ACTIVATIONS. PReLU has one learnable slope (init 0.25); LeakyReLU
# uses slope 0.1 as upstream.
ACTIVATION_FACTORIES: dict[str, Callable[[], nn.Module]] = {
    "ReLU": nn.ReLU,
    "LeakyReLU": lambda: nn.LeakyReLU(0.1),
    "PReLU": nn.PReLU,
    "tanh": nn.Tanh,
    "SELU": nn.SELU,
    "ELU": nn.ELU,
}


def make_activation(name: str) -> nn.Module:
    """A fresh activation module (:data:`ACTIVATION_FACTORIES`)."""
    if name not in ACTIVATION_FACTORIES:
        raise ValueError(f"activation {name!r} is not one of {ACTIVATIONS}")
    return ACTIVATION_FACTORIES[name]()


class PositionwiseFeedForward(nn.Module):
    """``W_2(dropout(act(W_1 x)))``; both Linears carry a bias. Keys: ``W_1``, ``W_2``, ``act_func``."""

    def __init__(self, d_in: int, d_ff: int, d_out: int, activation: str, dropout: float, rows: str) -> None:
        super().__init__()
        self.W_1 = nn.Linear(d_in, d_ff)
        self.W_2 = nn.Linear(d_ff, d_out)
        self.dropout = Dropout(dropout, rows)
        self.act_func = make_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.W_2(self.dropout(self.act_func(self.W_1(x))))


class SublayerConnection(nn.Module):
    """``dropout(LayerNorm(x))`` — upstream never uses the residual branch here. Keys: ``norm``."""

    def __init__(self, size: int, dropout: float, rows: str) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(size, elementwise_affine=True)
        self.dropout = Dropout(dropout, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.norm(x))


class MultiHeadedAttention(nn.Module):
    """Scaled dot-product attention across a short sequence (the MTBlock's heads) for every row independently.

    Input q, k, v: [R, L, d_model] (R rows = atoms or bonds, L = number of MPN heads). Output: [R, L, d_model].
    Keys: ``linear_layers.{0,1,2}`` (with bias), ``output_linear`` (bias = ``bias``).
    """

    def __init__(self, num_heads: int, d_model: int, dropout: float, bias: bool, rows: str = "atom") -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.linear_layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])
        self.output_linear = nn.Linear(d_model, d_model, bias)
        self.dropout = Dropout(dropout, rows)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        rows = query.shape[0]
        q, k, v = (
            proj(x).view(rows, -1, self.num_heads, self.d_k).transpose(1, 2)
            for proj, x in zip(self.linear_layers, (query, key, value))
        )
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        weights = self.dropout(F.softmax(scores, dim=-1))
        mixed = torch.matmul(weights, v).transpose(1, 2).contiguous().view(rows, -1, self.num_heads * self.d_k)
        return self.output_linear(mixed)

    def forward_stacked(self, qkv: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of query, key and value given as one [3, L, R, d_model] tensor: the three input
        projections as one batched matmul. Its one dropout call draws what :meth:`forward`'s does only per molecule
        (kermt.nn.keyed_dropout), not in upstream's torch RNG order: for dropout 0, eval or per-molecule draws."""
        _, length, rows, width = qkv.shape
        weights = torch.stack([layer.weight for layer in self.linear_layers]).transpose(1, 2)  # [3, d_in, d_out]
        biases = torch.stack([layer.bias for layer in self.linear_layers]).unsqueeze(1)  # [3, 1, d_out]
        projected = torch.baddbmm(biases, qkv.reshape(3, length * rows, width), weights)
        q, k, v = projected.view(3, length, rows, self.num_heads, self.d_k).unbind(0)  # each [L, R, n, d_k]
        scores = torch.einsum("lrnj,mrnj->rnlm", q, k) / math.sqrt(self.d_k)  # [R, n, L, L]
        attention = self.dropout(F.softmax(scores, dim=-1))
        mixed = torch.einsum("rnlm,mrnj->rlnj", attention, v).reshape(rows, length, width)
        return self.output_linear(mixed)
