"""Random draws of a pretraining step that depend only on (seed, global step, molecule), never on the worker.

A molecule's labelled atoms and bonds and its latent ε must be the same whether it sits on worker 0 of 1 or on
worker 1 of 2, so nothing here consumes a sequential RNG stream. Every draw is a counter-based hash
(splitmix64) of (seed, stream, step, molecule id, position): vectorised over a whole batch, and reproducible one
molecule at a time. Upstream draws from numpy's global RNG in batch order instead, which a data-parallel run
cannot reproduce (docs/upstream-compatibility.md#pretraining).
"""

from __future__ import annotations

import numpy as np

from kermt.random_streams import Stream, hashed_uniform, positions_within



def labelled_positions(
    seed: int, stream: int, step: int, molecules: np.ndarray, counts: np.ndarray, fraction: float
) -> np.ndarray:
    """Bool [sum counts]: ``ceil(fraction · n)`` items of each molecule chosen at random (the ``n`` items of
    molecule ``molecules[i]`` are consecutive; upstream's count rule, see kermt.chem.vocab_labels)."""
    counts = np.asarray(counts, dtype=np.int64)
    owner, position = positions_within(counts)
    keys = hashed_uniform(seed, stream, step, np.asarray(molecules, dtype=np.int64)[owner], position)
    order = np.lexsort((keys, owner))  # by molecule, then by key: a random permutation inside each molecule
    rank = np.empty_like(position)
    rank[order] = position
    wanted = np.ceil(counts * fraction).astype(np.int64)  # the float product, as upstream
    return rank < wanted[owner]


def latent_noise(seed: int, step: int, molecules: np.ndarray, latent_dim: int) -> np.ndarray:
    """ε ~ N(0, I) float32 [len(molecules), latent_dim] (Box–Muller on hashed uniforms)."""
    molecules = np.repeat(np.asarray(molecules, dtype=np.int64), latent_dim)
    dims = np.tile(np.arange(latent_dim, dtype=np.int64), len(molecules) // max(latent_dim, 1))
    u1 = hashed_uniform(seed, Stream.LATENT_NOISE, step, molecules, 2 * dims)
    u2 = hashed_uniform(seed, Stream.LATENT_NOISE, step, molecules, 2 * dims + 1)
    normal = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return normal.reshape(-1, latent_dim).astype(np.float32)


__all__ = ["labelled_positions", "latent_noise"]
