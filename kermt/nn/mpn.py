"""The q/k/v message-passing encoders of an MTBlock (docs/upstream-compatibility.md#message-passing).

Each :class:`MPNEncoder` owns upstream's parameters (``W_h``, ``act_func``) and one iteration of its update
``message <- dropout(act(inp + W_h(Σ neighbour messages)))``. :func:`run_encoders` runs every encoder of a block
for its own (dynamic) number of iterations.

Why one 2-D tensor per encoder rather than one stacked [K, R, h] tensor: with dynamic depth the encoders stop at
different iterations, and slicing a stacked tensor makes autograd materialise a zero gradient of the whole stack
for every slice (a full-size fill and copy per iteration), which cost as much as a third of the matmul time.
Per-encoder tensors keep the backward to the matmuls themselves; the neighbour sum of the shared input is
computed once for all encoders.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from kermt.nn.aggregate import GraphIndex
from kermt.nn.layers import make_activation


@dataclass(frozen=True)
class PassingMode:
    """How a stack of encoders passes messages: atom (node view) or directed-bond (edge view) messages.

    Upstream's ``undirected`` averaging is absent on purpose: :class:`~kermt.config.EncoderConfig` refuses it.
    """

    atom_messages: bool
    dropout: float
    training: bool


class MPNEncoder(nn.Module):
    """Parameters of one dyMPN encoder: ``W_h`` (hidden -> hidden, bias = ``bias``) and its own activation."""

    def __init__(self, hidden_size: int, bias: bool, activation: str) -> None:
        super().__init__()
        self.act_func = make_activation(activation)
        self.W_h = nn.Linear(hidden_size, hidden_size, bias=bias)

    def update(self, inp: torch.Tensor, incoming: torch.Tensor, mode: PassingMode) -> torch.Tensor:
        """One iteration: ``dropout(act(inp + W_h(incoming)))``; inp, incoming [R, h] -> [R, h]."""
        if self.W_h.bias is not None:
            inp = inp + self.W_h.bias
        # addmm adds the product to ``inp`` inside the GEMM: one pass fewer than linear-then-add
        pre_activation = torch.addmm(inp, incoming, self.W_h.weight.t())
        return F.dropout(self.act_func(pre_activation), mode.dropout, mode.training)


def _neighbour_sum(message: torch.Tensor, index: GraphIndex, mode: PassingMode) -> torch.Tensor:
    """Σ over neighbours of ``message`` [R, h]: atoms via a2a, or the directed-bond update."""
    return index.sum_neighbour_atoms(message) if mode.atom_messages else index.bond_messages(message)


def run_encoders(
    encoders: list[MPNEncoder],
    inp: torch.Tensor,
    iterations: list[int],
    index: GraphIndex,
    mode: PassingMode,
) -> list[torch.Tensor]:
    """Run every encoder on the same input ``inp`` [R, h] for its own number of iterations.

    Returns one [R, h] tensor per encoder, in the order of ``encoders``; an encoder with 0 iterations returns
    ``inp``. Every encoder's first iteration sums the same input, so that sum is computed once.
    """
    shared_incoming = _neighbour_sum(inp, index, mode) if max(iterations, default=0) > 0 else None
    outputs = []
    for encoder, count in zip(encoders, iterations):
        message = inp
        for step in range(count):
            incoming = shared_incoming if step == 0 else _neighbour_sum(message, index, mode)
            message = index.zero_padding_row(encoder.update(inp, incoming, mode))
        outputs.append(message)
    return outputs
