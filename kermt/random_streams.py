"""Every random draw that derives from a run's seed, by named stream: one place to see what draws what.

Two families, both pure functions of their key, never of how much was drawn before (so a resumed run, another worker
count or another batch draws the same numbers):

- **Sequential generators** (:func:`stream_rng`, :func:`stream_seed`): numpy's PCG64 seeded from
  ``[seed, stream, *keys]``: an epoch's molecule order, a step's message-passing depths, a member's seed, torch's
  per-worker seed. The stream id keeps two purposes apart that share their other keys: without it, the epoch-3 order
  and the step-3 depths of one seed would come from the same generator.
- **Counter-based hashes** (:func:`hashed_uniform`): splitmix64 of (seed, stream, step, molecule id, position), one
  uniform per item, vectorised over a batch or made for one molecule alone: bond dropout, pretraining labels and
  latent noise, the reconstruction probe's token draws.

The on-device dropout masks of ``dropout_draws="per_molecule"`` hash on the accelerator instead (kermt.nn.keyed_dropout;
its call counter plays the stream's part). Draws that must reproduce upstream (its splits, its vocabulary labels, its
depth draws with ``rng=None``) use upstream's own generators and live with the code they mirror.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    """Stream ids: unique across both families. A saved run's numbers depend on them: never renumber one."""

    ATOM_LABELS = 1  # hashed: pretraining atom-vocabulary labels (kermt.pretrain.draws)
    BOND_LABELS = 2  # hashed: pretraining bond-vocabulary labels
    LATENT_NOISE = 3  # hashed: cMIM's latent ε
    BOND_DROPOUT = 4  # hashed: finetune bond dropout (kermt.data.dataset)
    TOKEN_DRAWS = 11  # hashed: the reconstruction probe's sampled tokens (kermt.pretrain.reconstruct)
    EPOCH_ORDER = 21  # sequential: an epoch's molecule order (kermt.data.sampling)
    DEPTH = 22  # sequential: a step's dynamic message-passing depths (kermt.nn.depth)
    MEMBER_SEED = 23  # sequential: an ensemble member's seed from its fold's
    FINETUNE_TORCH = 24  # sequential: torch's RNG per (epoch, worker) in finetuning (dropout_draws "torch")
    PRETRAIN_TORCH = 25  # sequential: torch's RNG per (step, worker) in pretraining
    VALIDATION_ROWS = 26  # sequential: the corpus rows held out for pretraining validation
    EXPLORE_ROUND = 27  # sequential: a `kermt explore` round's draws (its random batch, thompson's samples)
    SHUFFLE_WINDOW = 28  # sequential: the training rows' order inside a window of shards (kermt.data.shard_plan)


def stream_rng(seed: int, stream: Stream, *keys: int) -> np.random.Generator:
    """A generator that depends only on (seed, stream, keys): identical on every rank and after a restart."""
    return np.random.default_rng([int(seed), int(stream), *(int(k) for k in keys)])


def stream_seed(seed: int, stream: Stream, *keys: int, high: int = 2**62) -> int:
    """One integer in [0, high) from :func:`stream_rng`: a seed for another generator (torch's, a member's)."""
    return int(stream_rng(seed, stream, *keys).integers(high))


def depth_rng(seed: int, global_step: int) -> np.random.Generator:
    """The dynamic-depth generator of one global step (the same on every data-parallel rank)."""
    return stream_rng(seed, Stream.DEPTH, global_step)


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


def hashed_uniform(seed: int, stream: Stream, step: int, molecules: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) float64 per (molecule, position) pair (equal-length int arrays), a pure function of the key."""
    key = _splitmix64(np.full(1, np.uint64(seed % 2**64)))
    for part in (int(stream), step):
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


__all__ = ["Stream", "depth_rng", "hashed_uniform", "positions_within", "stream_rng", "stream_seed"]
