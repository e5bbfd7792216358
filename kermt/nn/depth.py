"""Dynamic message-passing depth ("dyMPN", docs/upstream-compatibility.md#message-passing).

In train mode every q/k/v MPN encoder runs ``int(x) - 1`` iterations, where ``x`` is drawn from a normal
distribution with mean ``depth`` and sd 1 truncated to ``[depth - 3, depth + 3]``; in eval mode it runs
``depth - 1``. Upstream draws one value per encoder per forward from numpy's global RNG (through scipy) in
forward order: node blocks, then edge blocks; in each block head 0's q, k, v, then head 1's, ...

:func:`draw_depths` draws a whole forward's depths at once, in that order. With ``rng=None`` it consumes numpy's
global RNG exactly as upstream does (scipy draws ``size=n`` values identically to n scalar draws), so a seeded
run reproduces upstream's depths. With a ``numpy.random.Generator`` the draws are reproducible on their own:
``kermt.random_streams.depth_rng`` derives one from (run seed, global step), so every data-parallel rank draws the
same depths.
"""

from __future__ import annotations

import numpy as np

TRUNCATION_SDS = 3.0


def draw_depths(depth: int, count: int, rng: np.random.Generator | None = None) -> list[int]:
    """``count`` train-mode depths for encoders of nominal ``depth`` (each in [depth-3, depth+3])."""
    if count == 0:
        return []
    from scipy import stats  # on first use: only training draws depths (kermt.metrics._sklearn_metrics says why)

    dist = stats.truncnorm(-TRUNCATION_SDS, TRUNCATION_SDS, loc=depth, scale=1.0)
    samples = np.atleast_1d(dist.rvs(size=count, random_state=rng))
    return [int(value) for value in samples]


def iteration_count(depth: int) -> int:
    """Message-passing iterations of an encoder of (sampled) ``depth``: ``depth - 1``, none for a depth of 1 or less
    (upstream's ``range(ndepth - 1)``)."""
    return max(depth - 1, 0)

