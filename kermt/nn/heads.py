"""Finetune FFN heads and upstream's weight initialisation.

Upstream behaviour: docs/upstream-compatibility.md#finetune-heads and docs/upstream-compatibility.md#initialisation.

The Sequentials use upstream's layer positions, so keys read ``mol_atom_from_atom_ffn.1.weight``,
``.2.weight`` (PReLU), ``.4.weight``, ... Upstream builds ONE activation module (and one dropout) per FFN and puts
it at every activation position; we do the same, so a PReLU slope is one tensor listed under several keys. (Drawn
per molecule, each call of the shared dropout still takes a fresh stream: see :mod:`kermt.nn.keyed_dropout`.)
"""

from __future__ import annotations

import torch
from torch import nn

from kermt.nn.keyed_dropout import Dropout
from kermt.nn.layers import make_activation


def build_ffn(input_size: int, hidden_size: int, output_size: int, num_layers: int, dropout: float, activation: str):
    """``[Dropout, Linear(in→F)] + (num_layers−2)·[act, Dropout, Linear(F→F)] + [act, Dropout, Linear(F→out)]``.

    With ``num_layers == 1``: ``[Dropout, Linear(in→out)]``. The activation/dropout instances are shared.
    """
    if num_layers < 1:
        raise ValueError(f"ffn_num_layers must be >= 1, got {num_layers}")
    drop = Dropout(dropout, "molecule")
    if num_layers == 1:
        return nn.Sequential(drop, nn.Linear(input_size, output_size))
    act = make_activation(activation)
    layers: list[nn.Module] = [drop, nn.Linear(input_size, hidden_size)]
    for _ in range(num_layers - 2):
        layers += [act, drop, nn.Linear(hidden_size, hidden_size)]
    layers += [act, drop, nn.Linear(hidden_size, output_size)]
    return nn.Sequential(*layers)


def build_task_head(hidden_size: int, num_layers: int, dropout: float, activation: str,
                    output_size: int = 1) -> nn.Sequential:
    """One task's layers after the shared FFN, ending in ``output_size`` outputs (1; 2 with a variance head).

    ``num_layers == 1``: ``[Dropout, Linear(F→1)]`` (no activation after the shared FFN, as upstream).
    ``num_layers > 1``: ``(num_layers−1)·[act, Dropout, Linear(F→F)] + [act, Dropout, Linear(F→1)]``.
    Upstream passes the shared FFN's output size as the input size but, for ``num_layers > 1``, builds the first
    Linear from ``hidden_size``; the two are the same number (the shared FFN outputs ``hidden_size``).
    """
    drop = Dropout(dropout, "molecule")
    if num_layers == 1:
        return nn.Sequential(drop, nn.Linear(hidden_size, output_size))
    act = make_activation(activation)
    layers: list[nn.Module] = []
    for _ in range(num_layers - 1):
        layers += [act, drop, nn.Linear(hidden_size, hidden_size)]
    layers += [act, drop, nn.Linear(hidden_size, output_size)]
    return nn.Sequential(*layers)


@torch.no_grad()
def initialize_weights(module: nn.Module) -> None:
    """Upstream ``build_model`` init: every 1-D parameter (biases, LayerNorm gains, PReLU slopes) -> 0, every
    ≥2-D parameter -> xavier_normal. Shared tensors are initialised once."""
    for param in module.parameters():
        if param.dim() == 1:
            param.zero_()
        else:
            nn.init.xavier_normal_(param)
