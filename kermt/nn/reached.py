"""A gradient for every parameter on every rank: the parameters a loss does not reach get a zero one.

A step can leave parameters unused: a ``W_h`` skipped by a shallow dynamic-depth draw, every parameter on a rank
whose share of the global batch is empty. DDP without ``find_unused_parameters`` needs a gradient for every
parameter on every rank, and 1 worker must equal N workers, so every runner (finetune and pretraining steps) adds
``0 ×`` one element of each unreached parameter to its loss (cleared again before the optimizer step for the
encoders a depth draw skipped: :class:`~kermt.nn.encoder.DepthDrawLog`). Which parameters the loss reaches is read
from the autograd graph on the host, so the usual step, which reaches all of them, runs no extra op on the device.
"""

from __future__ import annotations

import torch
from torch import nn


def touch_unreached(loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """``loss`` plus 0 x (one element of every trainable parameter of ``model`` the loss does not depend on)."""
    reached = graph_leaves(loss)
    unreached = [p for p in model.parameters() if p.requires_grad and p not in reached]
    if not unreached:
        return loss
    return loss + torch.stack([p.reshape(-1)[0] for p in unreached]).sum() * 0.0


def graph_leaves(output: torch.Tensor) -> set[torch.Tensor]:
    """The leaf tensors (parameters) whose gradient the backward of ``output`` computes (a walk over its graph)."""
    leaves, seen, pending = set(), set(), [output.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold their leaf
        if variable is not None:
            leaves.add(variable)
        pending.extend(next_node for next_node, _ in node.next_functions)
    return leaves


__all__ = ["graph_leaves", "touch_unreached"]
