"""Mixed precision: a forward under bf16 autocast, with float32 where bf16 would lose the sum.

``autocast("bf16", device)`` runs matmuls (linear, bmm, baddbmm) in bfloat16; parameters, optimizer state and
gradients stay float32. The neighbour sums (sparse products) always run in float32: a row of the edge update adds
up to a dozen messages and subtracts one back, which in bf16's 8-bit mantissa would not cancel
(:class:`~kermt.nn.aggregate.GraphIndex`). Callers compute losses and metrics from float32 copies of the outputs.
How far bf16 outputs move from float32: docs/numerics.md#mixed-precision.
"""

from __future__ import annotations

import contextlib

import torch

from kermt.registry import PRECISIONS


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context a forward runs in: nothing for "fp32", bf16 autocast on ``device``'s type for "bf16"."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
