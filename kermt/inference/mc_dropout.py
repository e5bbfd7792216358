"""MC dropout at predict time (``kermt predict --dropout_samples N``): N stochastic forwards of each member with its
dropout layers on, everything else in eval mode.

"Dropout layers" are the model's :class:`~kermt.nn.keyed_dropout.Dropout` modules (the FFN heads', the encoder's
attention and feed-forward sublayers); the message-passing dropout inside the encoder follows the encoder's own
train flag, which also switches random depths, so it stays off. Every pass draws its masks per molecule
(:func:`~kermt.nn.keyed_dropout.per_molecule_draws`) keyed by (seed, pass, molecule), the molecule named by a hash
of its SMILES: predicting the same molecules twice gives the same numbers, wherever they sit in the input.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from kermt.checkpoint.spec import CheckpointSpec
from kermt.data.batch import BatchMolGraph
from kermt.errors import UserError
from kermt.nn.keyed_dropout import Dropout, per_molecule_draws

NO_DROPOUT = "trained with --dropout 0: MC dropout needs dropout > 0"


def check_dropout(specs: Sequence[CheckpointSpec], samples: int) -> None:
    """``--dropout_samples`` must be >= 0, and every member needs dropout to sample from."""
    if samples < 0:
        raise UserError(f"--dropout_samples {samples}: give a number of passes >= 1 (0 = no MC dropout)")
    if samples and any(spec.head.dropout == 0 and spec.encoder.dropout == 0 for spec in specs):
        raise UserError(f"--dropout_samples {samples}: the model was {NO_DROPOUT}; retrain with --dropout 0.1 (or "
                        "predict without --dropout_samples)")


def molecule_keys(smiles: Sequence[str]) -> np.ndarray:
    """int64 [N]: a stable 63-bit key of each SMILES string (blake2b; the same in every process and run)."""
    return np.array([int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little") >> 1
                     for s in smiles], dtype=np.int64)


@contextmanager
def dropout_on(model: nn.Module) -> Iterator[None]:
    """Within the block the model's dropout layers are in train mode, everything else as it was (eval)."""
    layers = [module for module in model.modules() if isinstance(module, Dropout)]
    states = [layer.training for layer in layers]
    for layer in layers:
        layer.train()
    try:
        yield
    finally:
        for layer, state in zip(layers, states):
            layer.train(state)


def sampled_outputs(model: nn.Module, graph: BatchMolGraph, features: torch.Tensor | None, keys: torch.Tensor,
                    samples: int, seed: int) -> list:
    """The model's outputs of ``samples`` dropout passes over ``graph`` whose molecules have ``keys`` [M]."""
    keyed = replace(graph, molecule_ids=keys)
    outputs = []
    with dropout_on(model):
        for sample in range(samples):
            with per_molecule_draws(seed, sample, keyed):
                outputs.append(model(keyed, features))
    return outputs


__all__ = ["NO_DROPOUT", "check_dropout", "dropout_on", "molecule_keys", "sampled_outputs"]
