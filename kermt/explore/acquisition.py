"""Acquisition: the value of scoring each unexplored molecule next, and the batch of highest values.

Every function here maximises: with ``minimize`` (lower scores are better, as docking scores) the surrogate's
means and the best score found are negated first, so that one set of formulas serves both directions and a larger
acquisition value is always more wanted. The values are pure functions of their inputs and the round's generator
(:func:`round_rng`), so a resumed exploration acquires the same molecules.

Names (``--acquisition``) are :data:`kermt.registry.ACQUISITIONS`; those in
:data:`kermt.registry.UNCERTAIN_ACQUISITIONS` read the surrogate's standard deviation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kermt.errors import UserError
from kermt.random_streams import Stream, stream_rng
from kermt.registry import ACQUISITIONS, UNCERTAIN_ACQUISITIONS

# ucb's default weight of the standard deviation (--beta), MolPAL's default
DEFAULT_BETA = 2.0
# ei and pi ask for an improvement of at least this much over the best score (MolPAL's default xi, in score units)
IMPROVEMENT_MARGIN = 0.01


@dataclass(frozen=True)
class Surrogate:
    """The surrogate's prediction for the candidates: ``mean`` and ``std`` (float64 [n]; ``std`` None when the
    surrogate gives no uncertainty), in score units."""

    mean: np.ndarray
    std: np.ndarray | None = None


def round_rng(seed: int, round_index: int) -> np.random.Generator:
    """The generator of round ``round_index``'s draws (its random batch, thompson's samples): the same whenever the
    round is run again."""
    return stream_rng(seed, Stream.EXPLORE_ROUND, round_index)


def _greedy(mean, std, best, beta, rng):
    return mean


def _ucb(mean, std, best, beta, rng):
    return mean + beta * std


def _improvement_z(mean, std, best):
    gain = mean - best - IMPROVEMENT_MARGIN
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(std > 0, gain / np.where(std > 0, std, 1.0), np.where(gain > 0, np.inf, -np.inf))
    return gain, z


def _ei(mean, std, best, beta, rng):
    from scipy.special import ndtr  # here: `kermt explore --help` reads this module's defaults, without SciPy

    gain, z = _improvement_z(mean, std, best)
    density = np.exp(-0.5 * np.where(np.isfinite(z), z, 0.0) ** 2) / np.sqrt(2 * np.pi)
    spread = np.where(std > 0, std * density, 0.0)
    return np.where(std > 0, gain * ndtr(z) + spread, np.maximum(gain, 0.0))


def _pi(mean, std, best, beta, rng):
    from scipy.special import ndtr

    return ndtr(_improvement_z(mean, std, best)[1])


def _thompson(mean, std, best, beta, rng):
    return rng.normal(mean, std)


def _random(mean, std, best, beta, rng):
    return rng.random(len(mean))


AcquisitionFunction = Callable[[np.ndarray, np.ndarray, float, float, np.random.Generator], np.ndarray]
ACQUISITION_FUNCTIONS: dict[str, AcquisitionFunction] = {
    "greedy": _greedy, "ucb": _ucb, "ei": _ei, "pi": _pi, "thompson": _thompson, "random": _random,
}
assert tuple(ACQUISITION_FUNCTIONS) == ACQUISITIONS, "kermt.registry.ACQUISITIONS names every function, in order"


def check_uncertainty(acquisition: str, has_uncertainty: bool, why_not: str) -> None:
    """A one-line error when ``acquisition`` reads an uncertainty the surrogate cannot give (``why_not`` says why
    and what gives one)."""
    if acquisition in UNCERTAIN_ACQUISITIONS and not has_uncertainty:
        raise UserError(f"--acquisition {acquisition} needs the surrogate's uncertainty, and {why_not}; use "
                        "--acquisition greedy or random, or a surrogate that gives one")


def acquisition_values(acquisition: str, surrogate: Surrogate, best: float, rng: np.random.Generator,
                       beta: float = DEFAULT_BETA, minimize: bool = False) -> np.ndarray:
    """The value of scoring each candidate (float64 [n]; larger is more wanted, NaN where the surrogate has no
    prediction). ``best``: the best score found so far (NaN before any: ei is then the mean and pi is 1,
    their limits as the best goes to -inf)."""
    sign = -1.0 if minimize else 1.0
    mean = sign * np.asarray(surrogate.mean, dtype=np.float64)
    if acquisition in UNCERTAIN_ACQUISITIONS:
        if surrogate.std is None:
            raise ValueError(f"acquisition {acquisition} needs the surrogate's std (check_uncertainty first)")
        std = np.nan_to_num(np.asarray(surrogate.std, dtype=np.float64), nan=0.0).clip(min=0.0)
    else:
        std = np.zeros_like(mean)
    if np.isfinite(best) or acquisition not in ("ei", "pi"):
        values = ACQUISITION_FUNCTIONS[acquisition](mean, std, sign * best, float(beta), rng)
    else:  # nothing scored yet: any prediction improves on nothing (the limits of ei and pi as best -> -inf)
        values = mean.copy() if acquisition == "ei" else np.ones_like(mean)
    return np.where(np.isnan(mean), np.nan, values)


def best_score(scores: np.ndarray, minimize: bool) -> float:
    """The best finite score (NaN when none is)."""
    finite = np.asarray(scores, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if not len(finite):
        return float("nan")
    return float(finite.min() if minimize else finite.max())


def top_batch(values: np.ndarray, excluded: np.ndarray, size: int) -> np.ndarray:
    """The rows of the ``size`` largest finite ``values`` not ``excluded`` (bool [n]), best first, ties broken by
    the lower row: the same rows for the same values whatever the machine. Fewer when fewer are left."""
    values = np.asarray(values, dtype=np.float64)
    candidates = np.flatnonzero(~np.asarray(excluded, dtype=bool) & np.isfinite(values))
    if size < len(candidates):
        # the size-th largest value, and every candidate at least as large (ties at the cut all stay in)
        cut = np.partition(values[candidates], len(candidates) - size)[len(candidates) - size]
        candidates = candidates[values[candidates] >= cut]
    order = np.lexsort((candidates, -values[candidates]))
    return candidates[order[:size]]


def random_batch(excluded: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` rows drawn uniformly without replacement from those not ``excluded``, in draw order."""
    candidates = np.flatnonzero(~np.asarray(excluded, dtype=bool))
    return rng.choice(candidates, size=min(size, len(candidates)), replace=False)


__all__ = ["ACQUISITION_FUNCTIONS", "DEFAULT_BETA", "IMPROVEMENT_MARGIN", "Surrogate", "acquisition_values",
           "best_score", "check_uncertainty", "random_batch", "round_rng", "top_batch"]
