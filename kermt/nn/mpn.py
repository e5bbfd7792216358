"""The q/k/v message-passing encoders of an MTBlock, run together (spec §4.3).

Each :class:`MPNEncoder` owns only its parameters (``W_h``, ``act_func``: upstream's keys). The computation is
done for all 3·H encoders of a block at once by :func:`run_encoders`: their messages live in one
[K, R, hidden] tensor, the neighbour sums are one segment sum, and ``W_h`` of all encoders is one batched matmul.

Dynamic depth: encoders are sorted by iteration count (descending) so the encoders still iterating at step t are
a prefix of the stack; the others keep their last message, exactly as if each had run its own loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from kermt.nn.aggregate import GraphIndex
from kermt.nn.layers import make_activation


class MPNEncoder(nn.Module):
    """Parameters of one dyMPN encoder: ``W_h`` (hidden -> hidden, bias = ``bias``) and its own activation."""

    def __init__(self, hidden_size: int, bias: bool, activation: str) -> None:
        super().__init__()
        self.act_func = make_activation(activation)
        self.W_h = nn.Linear(hidden_size, hidden_size, bias=bias)


@dataclass(frozen=True)
class PassingMode:
    """How a stack of encoders passes messages: atom (node view) or directed-bond (edge view) messages."""

    atom_messages: bool
    undirected: bool
    dropout: float
    training: bool


def _stacked_activation(encoders: list[MPNEncoder], z: torch.Tensor) -> torch.Tensor:
    """Apply encoder k's activation to ``z[k]`` ([K, R, h]). Only PReLU has per-encoder parameters."""
    first = encoders[0].act_func
    if not isinstance(first, nn.PReLU):
        return first(z)  # parameter-free: identical for every encoder
    slopes = torch.stack([enc.act_func.weight for enc in encoders]).view(-1, 1, 1)
    return torch.where(z >= 0, z, slopes * z)


def _step(
    encoders: list[MPNEncoder],
    inp: torch.Tensor,
    message: torch.Tensor,
    index: GraphIndex,
    mode: PassingMode,
) -> torch.Tensor:
    """One iteration for a stack of encoders: message [K, R, h] -> [K, R, h]; ``inp`` [R, h]."""
    if mode.undirected:
        message = (message + message.index_select(-2, index.b2revb)) / 2
    if mode.atom_messages:
        incoming = index.sum_neighbour_atoms(message)
    else:
        incoming = index.bond_messages(message)
    weight = torch.stack([enc.W_h.weight for enc in encoders])  # [K, h_out, h_in]
    hidden = torch.bmm(incoming, weight.transpose(1, 2))
    if encoders[0].W_h.bias is not None:
        hidden = hidden + torch.stack([enc.W_h.bias for enc in encoders]).unsqueeze(1)
    message = F.dropout(_stacked_activation(encoders, inp + hidden), mode.dropout, mode.training)
    return index.zero_padding_row(message)


def run_encoders(
    encoders: list[MPNEncoder],
    inp: torch.Tensor,
    iterations: list[int],
    index: GraphIndex,
    mode: PassingMode,
) -> torch.Tensor:
    """Run every encoder on the same input ``inp`` [R, h] for its own number of iterations.

    Returns [K, R, h] in the order of ``encoders``. An encoder with 0 iterations returns ``inp``.
    """
    order = sorted(range(len(encoders)), key=lambda k: -iterations[k])
    sorted_encoders = [encoders[k] for k in order]
    sorted_iters = [iterations[k] for k in order]
    message = inp.unsqueeze(0).expand(len(encoders), *inp.shape)
    finished: list[torch.Tensor] = []  # outputs of encoders that stopped, tail of the sorted order first
    for step in range(max(sorted_iters, default=0)):
        active = sum(1 for n in sorted_iters if n > step)
        if active < message.shape[0]:
            finished.append(message[active:])
            message = message[:active]
        message = _step(sorted_encoders[:active], inp, message, index, mode)
    in_sorted_order = torch.cat([message, *reversed(finished)], dim=0)
    restore = torch.empty(len(order), dtype=torch.long)
    restore[torch.tensor(order)] = torch.arange(len(order))
    return in_sorted_order.index_select(0, restore.to(inp.device))
