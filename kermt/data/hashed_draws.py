"""Counter-based random draws on the host: uniforms that are a pure function of their key, never of a sequence.

A draw keyed by (seed, stream, step, molecule id, position) is the same whichever batch, worker or process makes it,
and it can be made for a whole batch at once (vectorised) or for one molecule alone. Used for bond dropout
(:mod:`kermt.data.dataset`) and the pretraining draws (:mod:`kermt.pretrain.draws`); streams keep the draws of
different purposes independent for the same key.
"""

from __future__ import annotations

import numpy as np

# Streams in use: 1-3 pretraining labels and latent noise (kermt.pretrain.draws), 4 bond dropout, 11 reconstruct.
BOND_DROPOUT = 4
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, element-wise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX_1
        x = (x ^ (x >> np.uint64(27))) * _MIX_2
        return x ^ (x >> np.uint64(31))


def hashed_uniform(seed: int, stream: int, step: int, molecules: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) float64 per (molecule, position) pair (equal-length int arrays), a pure function of the key."""
    key = _splitmix64(np.full(1, np.uint64(seed % 2**64)))
    for part in (stream, step):
        key = _splitmix64(key ^ np.uint64(part % 2**64))
    mixed = _splitmix64(key ^ np.asarray(molecules, dtype=np.uint64))
    mixed = _splitmix64(mixed ^ np.asarray(positions, dtype=np.uint64))
    return (mixed >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def positions_within(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For items grouped by owner (``counts[i]`` consecutive items of owner i): each item's owner index and its
    position inside its owner's group, both int64 [sum counts]."""
    counts = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return owner, np.arange(int(counts.sum()), dtype=np.int64) - starts[owner]


__all__ = ["BOND_DROPOUT", "hashed_uniform", "positions_within"]
