"""Validation read from a split's shards: each rank reads only the shards that hold the chunks it predicts (plus
one column, the targets, of every shard), holds only those chunks, and predicts them exactly as it would from the
whole split in memory. (2 Ray workers validating from shards equal one process: tests/ray_app/finetune/
test_fold_data.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from kermt.data.molecule_shards import ValidationSource, read_split_shard, read_split_targets, write_split
from kermt.inference.split import predict_split
from kermt.nn.finetune import KermtFinetuneModel
from kermt.train.loop import rank_validation, validation_rule
from tests.kermt.data.test_molecule_shards import _same_molecules
from tests.kermt.train.member_plans import member_plan


def _source(tmp_path, val, shard_rows: int, reads: list[int]) -> ValidationSource:
    directory = str(tmp_path / f"val_{shard_rows}")
    manifest = write_split(directory, val, shard_rows)

    def load(index: int):
        reads.append(index)
        return read_split_shard(directory, manifest, index)

    targets = np.concatenate([read_split_targets(directory, manifest, i) for i in range(len(manifest.files))])
    return ValidationSource(manifest.rows, load, targets)


@pytest.mark.parametrize(("shard_rows", "rank_shards"), [(4, [[0, 2], [1, 3]]), (5, [[0, 1, 2], [0, 1, 2, 3]])])
def test_each_rank_reads_only_the_shards_of_its_chunks_and_holds_only_them(tmp_path, shard_rows, rank_shards):
    """16 validation molecules in chunks of 4 (the global batch), chunk i on rank i % 2: with shards of 4 each
    rank reads its two shards; with shards of 5 the chunks straddle shards, and a rank reads each shard once."""
    val = member_plan(4, "zero").val
    assert len(val) == 16
    for rank in range(2):
        reads: list[int] = []
        source = _source(tmp_path, val, shard_rows, reads)
        np.testing.assert_array_equal(source.targets, val.targets)
        part = rank_validation(source, 4, rank, 2)
        assert reads == rank_shards[rank]
        assert part.count == 4 and sorted(part.chunks) == [rank, rank + 2]
        rows = np.concatenate([np.arange(4 * i, 4 * i + 4) for i in (rank, rank + 2)])
        _same_molecules(part.held, val.take(rows))
        np.testing.assert_array_equal(part.targets, val.targets)
        in_memory = rank_validation(val, 4, rank, 2)
        _same_molecules(in_memory.held, part.held)
        assert {i: r.tolist() for i, r in in_memory.chunks.items()} == {i: r.tolist() for i, r in part.chunks.items()}


def test_a_rank_with_no_chunk_holds_nothing_and_a_source_refuses_unordered_rows(tmp_path):
    val = member_plan(16, "zero").val
    reads: list[int] = []
    source = _source(tmp_path, val, 5, reads)
    idle = rank_validation(source, 16, 1, 2)  # one chunk of 16: rank 0's
    assert idle.held is None and idle.chunks == {} and idle.count == 1 and reads == []
    with pytest.raises(ValueError, match="ascending"):
        source.take(np.array([3, 1]))


def test_a_ranks_chunks_predicted_from_its_shards_equal_the_whole_splits_predictions(tmp_path):
    """Upstream padding: each molecule at the member's reference width, whichever set holds it."""
    plan = member_plan(3, "upstream")
    model = KermtFinetuneModel(plan.model_config)
    model.load_state_dict(plan.initial_state)
    rule = validation_rule(plan)
    source = _source(tmp_path, plan.val, 5, [])
    whole = predict_split(model, plan.val, 3, rule)[0]
    for rank in range(3):
        part = rank_validation(source, 3, rank, 3)
        for i, rows in part.chunks.items():
            got = predict_split(model, part.held, 3, rule, rows=rows)[0]
            np.testing.assert_array_equal(got, whole[3 * i:3 * i + len(rows)])
