"""The q/k/v message-passing encoders of an MTBlock (docs/upstream-compatibility.md#message-passing).

Each :class:`MPNEncoder` owns upstream's parameters (``W_h``, ``act_func``) and one iteration of its update
``message <- dropout(act(inp + W_h(Σ neighbour messages)))``. Two ways to run every encoder of a block, each for
its own (dynamic) number of iterations:

- :func:`run_encoders_stacked`, whenever no dropout is drawn from torch's RNG (eval mode, training with dropout
  0, or dropout drawn per molecule): all encoders as one [K, R, h] computation, per iteration one sparse product
  with a block-diagonal operator, one batched matmul, one activation (and one dropout mask) instead of K of each
  (K = 3 x heads launches become one on a GPU);
- :func:`run_encoders`, encoder by encoder, iteration by iteration, which is the order in which upstream draws
  its dropout masks from torch's RNG: training with dropout reproduces upstream's masks only this way. It keeps
  one 2-D tensor per encoder (slicing a stack would make autograd fill a zero gradient of the whole stack per
  slice); the neighbour sum of the shared input is computed once for all encoders.

Drawn per molecule (:mod:`kermt.nn.keyed_dropout`), iteration t of encoder k uses stream ``streams[k] + t``
(:func:`dropout_streams`), so both ways draw the same masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from kermt.nn import keyed_dropout
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

    @property
    def rows(self) -> str:
        """The kind of rows messages live on (the key of per-molecule dropout)."""
        return "atom" if self.atom_messages else "bond"


class MPNEncoder(nn.Module):
    """Parameters of one dyMPN encoder: ``W_h`` (hidden -> hidden, bias = ``bias``) and its own activation."""

    def __init__(self, hidden_size: int, bias: bool, activation: str) -> None:
        super().__init__()
        self.act_func = make_activation(activation)
        self.W_h = nn.Linear(hidden_size, hidden_size, bias=bias)

    def update(self, inp: torch.Tensor, incoming: torch.Tensor, mode: PassingMode,
               stream: int | None = None) -> torch.Tensor:
        """One iteration: ``dropout(act(inp + W_h(incoming)))``; inp, incoming [R, h] -> [R, h]. ``stream``: the
        iteration's per-molecule dropout stream (None: torch's RNG)."""
        if self.W_h.bias is not None:
            inp = inp + self.W_h.bias
        # addmm adds the product to ``inp`` inside the GEMM: one pass fewer than linear-then-add
        pre_activation = torch.addmm(inp, incoming, self.W_h.weight.t())
        return keyed_dropout.dropout(self.act_func(pre_activation), mode.dropout, mode.training, mode.rows, stream)


def dropout_streams(iterations: list[int]) -> list[int] | None:
    """Per encoder, the per-molecule dropout stream of its first iteration (one stream per iteration, reserved
    here in encoder order); None when dropout uses torch's RNG."""
    first = keyed_dropout.reserve_streams(sum(iterations))
    if first is None:
        return None
    starts = [first]
    for count in iterations[:-1]:
        starts.append(starts[-1] + count)
    return starts


def _operator(mode: PassingMode) -> str:
    """The neighbour sum of the passing mode: atoms via a2a, or the directed-bond update."""
    return "neighbour_atoms" if mode.atom_messages else "bond_update"


def _neighbour_sum(message: torch.Tensor, index: GraphIndex, mode: PassingMode) -> torch.Tensor:
    """Σ over neighbours of ``message`` [R, h]."""
    return index.apply(_operator(mode), message)


def run_encoders(
    encoders: list[MPNEncoder],
    inp: torch.Tensor,
    iterations: list[int],
    index: GraphIndex,
    mode: PassingMode,
    streams: list[int] | None = None,
) -> list[torch.Tensor]:
    """Run every encoder on the same input ``inp`` [R, h] for its own number of iterations.

    Returns one [R, h] tensor per encoder, in the order of ``encoders``; an encoder with 0 iterations returns
    ``inp``. Every encoder's first iteration sums the same input, so that sum is computed once. ``streams``: see
    :func:`dropout_streams` (None: torch's RNG).
    """
    shared_incoming = _neighbour_sum(inp, index, mode) if max(iterations, default=0) > 0 else None
    outputs = []
    for k, (encoder, count) in enumerate(zip(encoders, iterations)):
        message = inp
        for step in range(count):
            incoming = shared_incoming if step == 0 else _neighbour_sum(message, index, mode)
            stream = None if streams is None else streams[k] + step
            message = index.zero_padding_row(encoder.update(inp, incoming, mode, stream))
        outputs.append(message)
    return outputs


def can_stack(encoders: list[MPNEncoder], mode: PassingMode) -> bool:
    """Whether :func:`run_encoders_stacked` computes what :func:`run_encoders` does: no dropout drawn from torch's
    RNG (its order, encoder by encoder, is upstream's) and one kind of activation."""
    no_rng_draws = not mode.training or mode.dropout == 0.0 or keyed_dropout.active_draws() is not None
    return bool(encoders) and no_rng_draws and len({type(encoder.act_func) for encoder in encoders}) == 1


def _slopes(encoders: list[MPNEncoder]) -> torch.Tensor | None:
    """The encoders' PReLU slopes [K], or None for a parameter-free activation."""
    if not isinstance(encoders[0].act_func, nn.PReLU):
        return None
    if any(encoder.act_func.weight.numel() != 1 for encoder in encoders):
        raise ValueError("stacked PReLU needs one slope per encoder")
    return torch.cat([encoder.act_func.weight for encoder in encoders])


def _activate(x: torch.Tensor, slopes: torch.Tensor | None, act: nn.Module) -> torch.Tensor:
    """Each encoder's activation on its slice of ``x`` [K, R, h], as one op."""
    if slopes is None:
        return act(x)
    # prelu's channel dimension is 1: the [R, K, h] view puts the encoders there
    return F.prelu(x.transpose(0, 1), slopes).transpose(0, 1)


def run_encoders_stacked(
    encoders: list[MPNEncoder], inp: torch.Tensor, iterations: list[int], index: GraphIndex, mode: PassingMode,
    streams: list[int] | None = None,
) -> torch.Tensor:
    """What :func:`run_encoders` computes, stacked: [K, R, h] in encoder order (valid where :func:`can_stack`;
    ``streams`` as there, required when dropout is drawn per molecule).

    The encoders run sorted by iteration count, longest first, so the ones still running at any iteration are a
    leading block: each iteration is one block-diagonal sparse product, one batched matmul and one activation for
    all of them. When some stop, their messages are split off (a split, unlike a slice, gives the backward one
    concatenation rather than a zero-filled copy of the whole stack per piece).
    """
    order = sorted(range(len(encoders)), key=lambda k: -iterations[k])  # stable: eval keeps encoder order
    running_encoders = [encoders[k] for k in order]
    counts = [iterations[k] for k in order]
    weights = torch.stack([encoder.W_h.weight for encoder in running_encoders]).transpose(1, 2)  # [K, in, out]
    biases = [encoder.W_h.bias for encoder in running_encoders]
    base = inp.unsqueeze(0)
    if biases[0] is not None:
        base = base + torch.stack(biases).unsqueeze(1)
    slopes = _slopes(running_encoders)
    finished, message, running = [], None, len(encoders)
    for step in range(counts[0]):
        still = sum(count > step for count in counts)
        if still < running:  # the encoders that ran ``step`` iterations are done
            sizes = [still, running - still]
            if message is None:
                finished.append(inp.unsqueeze(0).expand(sizes[1], -1, -1))
            else:
                message, done = message.split(sizes)
                finished.append(done)
            weights = weights.split(sizes)[0]
            slopes = slopes.split(sizes)[0] if slopes is not None else None
            base = base.split(sizes)[0] if base.shape[0] > 1 else base
            running = still
        if message is None:
            incoming = _neighbour_sum(inp, index, mode).unsqueeze(0).expand(running, -1, -1)
        else:
            incoming = index.apply_stacked(_operator(mode), message)
        pre_activation = torch.baddbmm(base, incoming, weights)
        message = _activate(pre_activation, slopes, running_encoders[0].act_func)
        if streams is not None:
            message = keyed_dropout.stacked_dropout(message, mode.dropout, mode.training, mode.rows,
                                                    [streams[k] + step for k in order[:running]])
        message = index.zero_padding_row(message)
    finished.append(message if message is not None else inp.unsqueeze(0).expand(len(encoders), -1, -1))
    by_rank = finished[0] if len(finished) == 1 else torch.cat(finished[::-1])  # [K, R, h], sorted order
    return _in_encoder_order(by_rank, order)


def _in_encoder_order(by_rank: torch.Tensor, order: list[int]) -> torch.Tensor:
    """[K, R, h] stacked in ``order`` (encoder indices) -> the same stack in encoder order.

    One gather: its backward is one scatter-add, where per-encoder slices would each fill a zero copy of the
    stack. The index is host data, copied without waiting for the device.
    """
    if order == sorted(order):
        return by_rank
    rank_of = torch.as_tensor(sorted(range(len(order)), key=order.__getitem__), device="cpu")
    return by_rank.index_select(0, rank_of.to(by_rank.device, non_blocking=True))
