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


@dataclass(frozen=True)
class StackedParameters:
    """The sorted encoders' parameters stacked once per forward; ``[:k]`` selects the first k encoders.

    weight_t [K, h_in, h_out]; bias [K, 1, h] or None; slopes [K] (PReLU) or None, then ``activation`` (a
    parameter-free module shared by all encoders) is used.
    """

    weight_t: torch.Tensor
    bias: torch.Tensor | None
    slopes: torch.Tensor | None
    activation: nn.Module

    @classmethod
    def of(cls, encoders: list[MPNEncoder]) -> "StackedParameters":
        first = encoders[0]
        bias = None if first.W_h.bias is None else torch.stack([e.W_h.bias for e in encoders]).unsqueeze(1)
        is_prelu = isinstance(first.act_func, nn.PReLU)
        return cls(
            weight_t=torch.stack([e.W_h.weight for e in encoders]).transpose(1, 2),
            bias=bias,
            slopes=torch.cat([e.act_func.weight for e in encoders]) if is_prelu else None,
            activation=first.act_func,
        )

    def activate(self, z: torch.Tensor) -> torch.Tensor:
        """Encoder k's activation on ``z[k]`` ([k, R, h]): PReLU with per-encoder slopes as one kernel."""
        if self.slopes is None:
            return self.activation(z)
        # [1, k, R·h] puts the encoder axis on prelu's channel dimension without copying
        return F.prelu(z.reshape(1, z.shape[0], -1), self.slopes[: z.shape[0]]).view_as(z)


def _step(
    params: StackedParameters,
    active: int,
    inp: torch.Tensor,
    message: torch.Tensor,
    index: GraphIndex,
    mode: PassingMode,
) -> torch.Tensor:
    """One iteration of the first ``active`` encoders: message [active, R, h] (or [R, h] while all encoders still
    share the input) -> [active, R, h]; ``inp`` [R, h]."""
    if mode.undirected:
        message = (message + message.index_select(-2, index.b2revb)) / 2
    incoming = index.sum_neighbour_atoms(message) if mode.atom_messages else index.bond_messages(message)
    hidden = torch.matmul(incoming, params.weight_t[:active])
    if params.bias is not None:
        hidden = hidden + params.bias[:active]
    message = F.dropout(params.activate(inp + hidden), mode.dropout, mode.training)
    return index.zero_padding_row(message)


def run_encoders(
    encoders: list[MPNEncoder],
    inp: torch.Tensor,
    iterations: list[int],
    index: GraphIndex,
    mode: PassingMode,
) -> torch.Tensor:
    """Run every encoder on the same input ``inp`` [R, h] for its own number of iterations.

    Returns [K, R, h] in the order of ``encoders``. An encoder with 0 iterations returns ``inp``. The first
    iteration aggregates the shared input once for all encoders.
    """
    order = sorted(range(len(encoders)), key=lambda k: -iterations[k])
    params = StackedParameters.of([encoders[k] for k in order])
    sorted_iters = [iterations[k] for k in order]
    message, count = inp, len(encoders)  # 2-D while every encoder still holds the shared input
    finished: list[torch.Tensor] = []  # outputs of encoders that stopped, tail of the sorted order first
    for step in range(max(sorted_iters, default=0)):
        active = sum(1 for n in sorted_iters if n > step)
        if active < count:
            stopped = message[active:] if message.dim() == 3 else inp.expand(count - active, *inp.shape)
            finished.append(stopped)
            message = message[:active] if message.dim() == 3 else message
            count = active
        message = _step(params, active, inp, message, index, mode)
    if message.dim() == 2:
        message = message.expand(count, *message.shape)
    in_sorted_order = torch.cat([message, *reversed(finished)], dim=0)
    restore = torch.empty(len(order), dtype=torch.long)
    restore[torch.tensor(order)] = torch.arange(len(order))
    return in_sorted_order.index_select(0, restore.to(inp.device))
