"""The acquisition one block at a time (kermt.explore.blocks) against the whole-array functions it replaces in the
driver: the same rows in the same order, ties included, with the running top cut back often."""

from __future__ import annotations

import numpy as np
import pytest

from kermt.explore.acquisition import Surrogate, acquisition_values, random_batch, round_rng, top_batch
from kermt.explore.blocks import RunningTop, acquire_in_blocks, random_rows


def _ties(n: int, seed: int = 0) -> np.ndarray:
    """Values on a coarse grid (many ties), a few NaN and infinite."""
    rng = np.random.default_rng(seed)
    values = np.round(rng.normal(size=n), 1)
    values[rng.choice(n, n // 20, replace=False)] = np.nan
    values[rng.choice(n, 3, replace=False)] = np.inf
    return values


@pytest.mark.parametrize("size", [1, 7, 40, 300, 5000])
@pytest.mark.parametrize("block", [1, 13, 1000])
def test_the_running_top_keeps_what_top_batch_chooses(size, block):
    n = 3000
    values = _ties(n)
    excluded = np.zeros(n, dtype=bool)
    excluded[np.random.default_rng(1).choice(n, 200, replace=False)] = True
    top = RunningTop(size, min_held=16)  # cut back as soon as it holds more than max(2 size, 16)
    for start in range(0, n, block):
        at = start + np.flatnonzero(np.isfinite(values[start:start + block]) & ~excluded[start:start + block])
        top.offer(at, values[at], values[at] + 1, -values[at])
        assert top.held <= max(2 * size, 16)
    chosen = top.chosen()
    expected = top_batch(values, excluded, size)
    np.testing.assert_array_equal(chosen.rows, expected)
    np.testing.assert_array_equal(chosen.values, values[expected])
    np.testing.assert_array_equal(chosen.mean, values[expected] + 1)  # each row's own columns travel with it
    np.testing.assert_array_equal(chosen.std, -values[expected])
    if 1 < size < 2000:
        assert len(set(values[expected])) < size  # the cut fell among ties


def test_a_tie_at_the_floor_goes_to_the_earlier_row():
    top = RunningTop(2, min_held=0)
    top.offer(np.array([0, 1, 2]), np.array([1.0, 2.0, 1.0]), np.zeros(3), np.zeros(3))  # cut: keeps rows 1, 0
    top.offer(np.array([3, 4]), np.array([1.0, 1.5]), np.zeros(2), np.zeros(2))
    np.testing.assert_array_equal(top.chosen().rows, [1, 4])
    np.testing.assert_array_equal(top.chosen().values, [2.0, 1.5])


@pytest.mark.parametrize("acquisition", ["greedy", "ucb", "ei", "pi", "thompson", "random"])
def test_blocks_choose_the_whole_arrays_batch(acquisition):
    n = 2500
    mean = _ties(n, seed=2)
    mean[np.isinf(mean)] = 0.5
    std = np.abs(np.round(np.random.default_rng(3).normal(size=n), 1))  # zeros and ties among them
    explored = np.random.default_rng(4).choice(n, 300, replace=False)
    excluded = np.zeros(n, dtype=bool)
    excluded[explored] = True
    for seed, minimize, best in ((0, False, 1.2), (1, True, -0.3), (2, False, np.nan)):
        whole = acquisition_values(acquisition, Surrogate(mean, std), best, round_rng(seed, 1), minimize=minimize)
        expected = top_batch(whole, excluded, 120)
        blocks = ((s, Surrogate(mean[s:s + 333], std[s:s + 333])) for s in range(0, n, 333))
        chosen = acquire_in_blocks(acquisition, blocks, explored, 120, best, round_rng(seed, 1), minimize=minimize)
        np.testing.assert_array_equal(chosen.rows, expected)
        np.testing.assert_array_equal(chosen.values, whole[expected])
        np.testing.assert_array_equal(chosen.mean, mean[expected])
        np.testing.assert_array_equal(chosen.std, std[expected])


def test_blocks_must_be_consecutive():
    blocks = [(0, Surrogate(np.zeros(3), np.zeros(3))), (4, Surrogate(np.zeros(3), np.zeros(3)))]
    with pytest.raises(ValueError, match="starts at row 4, not 3"):
        acquire_in_blocks("greedy", blocks, np.zeros(0, np.int64), 2, 0.0, round_rng(0, 1))


@pytest.mark.parametrize("rows, explored, size", [(100, 0, 20), (100, 90, 20), (50_000, 3_000, 400),
                                                  (50_000, 100, 5_000), (12, 12, 3), (30, 0, 30)])
def test_random_rows_are_random_batchs(rows, explored, size):
    for seed in range(3):
        taken = np.random.default_rng(seed + 10).choice(rows, explored, replace=False)
        excluded = np.zeros(rows, dtype=bool)
        excluded[taken] = True
        expected = random_batch(excluded, size, round_rng(seed, 0))
        got = random_rows(taken, rows, size, round_rng(seed, 0))
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.int64 and not excluded[got].any()
