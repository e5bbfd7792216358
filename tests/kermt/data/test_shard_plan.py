"""The sharded epoch plan: every training row once per epoch, validation rows never trained on, the same batches for
a seed whatever the world size or the batch the run resumes at, and rows that stay inside their shuffle window."""

from __future__ import annotations

import numpy as np
import pytest

from kermt.data.corpus import CorpusArrays
from kermt.data.sampling import worker_share
from kermt.data.shard_plan import ShardPlan
from kermt.data.shard_stream import epoch_batches, validation_batches
from tests.kermt.pretrain.tiny_corpus import fixture_smiles, tiny_arrays

SHARDS = (7, 5, 9, 3, 8, 6)  # 38 rows


def _epoch_ids(plan: ShardPlan, epoch: int, batch: int) -> list[np.ndarray]:
    """Corpus rows of every global batch, from the plan alone."""
    out = []
    for k in range(plan.batch_count(batch)):
        ids = []
        for window, start, stop in plan.batch_pieces(epoch, k, batch):
            shards = plan.windows(epoch)[window]
            slots, rows = plan.window_rows(epoch, window)
            ids.append((plan.offsets[shards][slots] + rows)[start:stop])
        out.append(np.concatenate(ids))
    return out


def test_validation_rows_are_the_fraction_spread_over_the_shards_and_fixed_by_the_seed():
    plan = ShardPlan(SHARDS, seed=3, val_fraction=0.25, window=2)
    assert plan.n_val == round(38 * 0.25) == 10
    assert plan.val_counts.tolist() == [2, 1, 2, 1, 2, 2]  # floor + the largest remainders (ties: earlier shard)
    for shard, rows in enumerate(SHARDS):
        train, val = plan.split(shard)
        assert sorted([*train, *val]) == list(range(rows))
        assert np.array_equal(val, ShardPlan(SHARDS, 3, 0.25, window=5).split(shard)[1])  # not the window's
    assert not all(np.array_equal(plan.split(s)[1], ShardPlan(SHARDS, 4, 0.25).split(s)[1]) for s in range(6))


def test_every_training_row_once_per_epoch_and_no_validation_row():
    plan = ShardPlan(SHARDS, seed=1, val_fraction=0.25, window=2)
    val = {int(plan.offsets[s] + r) for s in range(6) for r in plan.split(s)[1]}
    for epoch in range(3):
        batches = _epoch_ids(plan, epoch, 5)
        assert [len(b) for b in batches] == [5] * 5 + [3]  # 28 training rows, the tail smaller
        used = np.concatenate(batches).tolist()
        assert sorted(used) == sorted(set(range(38)) - val)
    assert not np.array_equal(np.concatenate(_epoch_ids(plan, 0, 5)), np.concatenate(_epoch_ids(plan, 1, 5)))


def test_rows_stay_in_their_window_and_the_order_is_seeded():
    plan = ShardPlan(SHARDS, seed=7, val_fraction=0.0, window=2)
    order = np.concatenate(_epoch_ids(plan, 2, 4))
    shard_of = np.searchsorted(plan.offsets, order, side="right") - 1
    position = 0
    for shards in plan.windows(2):  # a window's rows come before the next window's, whatever the batch size
        size = int(np.asarray(SHARDS)[shards].sum())
        assert set(shard_of[position:position + size].tolist()) == set(shards.tolist())
        position += size
    assert np.array_equal(order, np.concatenate(_epoch_ids(ShardPlan(SHARDS, 7, 0.0, window=2), 2, 9)))
    assert not np.array_equal(order, np.concatenate(_epoch_ids(ShardPlan(SHARDS, 8, 0.0, window=2), 2, 4)))


def test_a_batch_is_the_same_rows_on_any_world_size():
    plan = ShardPlan(SHARDS, seed=2, val_fraction=0.1, window=3)
    for batch in _epoch_ids(plan, 0, 6):
        for world in (2, 3, 4):
            assert np.array_equal(np.concatenate([worker_share(batch, r, world) for r in range(world)]), batch)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="shuffle window"):
        ShardPlan(SHARDS, 0, 0.1, window=0)
    with pytest.raises(ValueError, match="global batch size"):
        ShardPlan(SHARDS, 0, 0.1).batch_count(0)


# --- reading the plan's batches from shards ----------------------------------------------------------------------

DATA, _ = tiny_arrays(fixture_smiles())  # 26 molecules
CUTS = (0, 6, 11, 20, 26)


def _shards() -> list[CorpusArrays]:
    return [DATA.arrays.take(np.arange(a, b)) for a, b in zip(CUTS, CUTS[1:])]


def test_the_stream_reads_the_plan_s_rows_from_the_shards_and_holds_few_windows():
    shards, reads = _shards(), []

    def load(index: int) -> CorpusArrays:
        reads.append(index)
        return shards[index]

    plan = ShardPlan(tuple(len(s) for s in shards), seed=5, val_fraction=0.2, window=1)
    expected = _epoch_ids(plan, 1, 4)
    got = list(epoch_batches(plan, 1, 4, 0, load))
    assert [b.ids.tolist() for b in got] == [e.tolist() for e in expected]
    for batch in got:  # each row's molecule is the corpus row its id names
        assert list(batch.arrays.smiles) == [DATA.arrays.smiles[i] for i in batch.ids]
    assert sorted(reads) == [0, 1, 2, 3]  # each shard read once in the epoch
    resumed = list(epoch_batches(plan, 1, 4, 3, load))  # from batch 3: the same batches as the whole epoch's tail
    assert [b.ids.tolist() for b in resumed] == [b.ids.tolist() for b in got[3:]]
    val = validation_batches(plan, 4, 1, load)
    assert len(val) == 1 and len(val[0]) == 4
    assert list(val[0].arrays.smiles) == [DATA.arrays.smiles[i] for i in val[0].ids]
    assert set(val[0].ids.tolist()).isdisjoint(np.concatenate([b.ids for b in got]).tolist())


def test_a_shard_that_cannot_be_read_fails_the_batch_that_needs_it():
    def load(index: int) -> CorpusArrays:
        raise OSError(f"shard {index} is gone")

    plan = ShardPlan((6, 5), seed=0, val_fraction=0.0, window=1)
    with pytest.raises(OSError, match="is gone"):
        next(epoch_batches(plan, 0, 4, 0, load))
