"""A finetune split as shards: written and read back bit for bit; a split small enough for one shuffle window is
trained in the very order it had in memory (one plan rule for both), and the member loop over its shards computes
the numbers it computes over the set in memory; a larger one is read a window at a time, each shard once an epoch."""

from __future__ import annotations

import dataclasses
import json
from functools import partial

import numpy as np
import torch

from kermt.data.molecule_shards import SplitManifest, TrainingSource, read_split, read_split_shard, write_split
from kermt.data.sampling import epoch_order
from kermt.data.shard_plan import ShardPlan
from kermt.data.shard_stream import epoch_batches
from kermt.inference.widths import training_width_histogram
from kermt.train.loop import fit
from tests.kermt.train.member_plans import member_plan


def _same_molecules(a, b) -> None:
    assert a.smiles == b.smiles
    np.testing.assert_array_equal(a.targets, b.targets)
    np.testing.assert_array_equal(a.features, b.features)
    for name, values in a.graphs.to_arrays().items():
        np.testing.assert_array_equal(values, b.graphs.to_arrays()[name], err_msg=name)


def test_a_split_written_as_shards_reads_back_bit_for_bit(tmp_path):
    train = member_plan(8, "zero", features_generator=("rdkit_2d_normalized",)).train
    manifest = write_split(str(tmp_path), train, shard_rows=12)
    assert manifest.rows == (12, 12, 12, 8)  # 44 molecules
    assert json.loads((tmp_path / "manifest.json").read_text())["files"] == [
        f"shard_{i:06d}.parquet" for i in range(4)]
    assert SplitManifest.read(str(tmp_path)) == manifest
    _same_molecules(read_split(str(tmp_path)), train)
    _same_molecules(read_split_shard(str(tmp_path), manifest, 2), train.take(np.arange(24, 36)))


def test_one_window_is_the_full_shuffle_the_set_had_in_memory():
    for rows in [(44,), (12, 12, 12, 8)]:  # one shard, or four in one window of four
        plan = ShardPlan(rows, seed=4, val_fraction=0.0, window=4)
        for epoch in range(3):
            np.testing.assert_array_equal(plan.epoch_ids(epoch), epoch_order(44, 4, epoch))
    blocked = ShardPlan((12, 12, 12, 8), seed=4, val_fraction=0.0, window=2)
    assert sorted(blocked.epoch_ids(0).tolist()) == list(range(44))
    assert not np.array_equal(blocked.epoch_ids(0), epoch_order(44, 4, 0))


def _sharded(tmp_path, train, shard_rows: int, window: int) -> TrainingSource:
    manifest = write_split(str(tmp_path), train, shard_rows)
    load = partial(read_split_shard, str(tmp_path), manifest)
    return TrainingSource(manifest.rows, load, np.maximum(train.graphs.max_in_degrees(), 1), window)


def test_the_member_loop_over_shards_trains_what_it_trains_in_memory(tmp_path):
    """4 shards in one window: the same batches, widths, bond dropout and dropout keys as the set in memory, so
    the same parameters bit for bit (upstream padding: the reference width comes from the same histogram)."""
    plan = member_plan(8, "upstream", epochs=2)
    source = _sharded(tmp_path, plan.train, 12, window=4)
    assert training_width_histogram(source, 4, 2, 8) == training_width_histogram(plan.train.graphs, 4, 2, 8)
    in_memory, sharded = fit(plan).checkpoint(), fit(dataclasses.replace(plan, train=source)).checkpoint()
    assert sharded["progress"]["global_step"] == in_memory["progress"]["global_step"] == 12
    for name, value in in_memory["model"].items():
        torch.testing.assert_close(sharded["model"][name], value, rtol=0, atol=0, msg=name)
    assert sharded["progress"]["history"][-1]["val_rmse"] == in_memory["progress"]["history"][-1]["val_rmse"]


def test_a_larger_split_is_read_a_window_at_a_time_each_shard_once_an_epoch(tmp_path):
    train = member_plan(8, "zero").train
    reads: list[int] = []
    source = _sharded(tmp_path, train, 6, window=2)  # 8 shards, windows of 2: a block shuffle

    def load(index: int):
        reads.append(index)
        return source.load(index)

    plan = source.plan(seed=4)
    batches = list(epoch_batches(plan, 1, 8, 0, load))
    assert sorted(reads) == list(range(8))  # each shard once, in the epoch's window order
    assert reads == np.concatenate(plan.windows(1)).tolist()
    ids = np.concatenate([b.ids for b in batches])
    np.testing.assert_array_equal(ids, plan.epoch_ids(1))
    for batch in batches:  # each batch holds the molecules its ids name
        _same_molecules(batch.arrays, train.take(batch.ids))
