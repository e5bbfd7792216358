"""A fold's training data as shards in the run's storage, read by the Ray Train workers themselves: the workers get
no molecules in their config (only where the shards are), 2 workers train what one process trains over the same
shards, and a run killed mid-way resumes on 1 worker to the same result. The split is cut into 4 shards shuffled in
windows of 2 (a block shuffle: the order differs from the one-window full shuffle), so the windowed reads are what
is tested."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from kermt.train.loop import MemberPlan, fit
from ray_app.common.worker_loop import STATE_FILE
from ray_app.finetune.fold_data import FoldData, write_fold_data
from ray_app.finetune.train_loop import train_loop_per_worker
from tests.kermt.train.member_plans import assert_only_shift_invariant_noise, assert_same_training, member_plan
from tests.ray_app.finetune.test_train_loop import killing_a_worker_after_first_checkpoint


def _fit(plan: MemberPlan, data: FoldData, workers: int, tmp_path, name: str) -> dict:
    result = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"plan": dataclasses.replace(plan, train=None, val=None), "data": data},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path), failure_config=FailureConfig(0)),
    ).fit()
    with result.checkpoint.as_directory() as directory:
        return torch.load(f"{directory}/{STATE_FILE}", weights_only=True)


def _sharded(plan: MemberPlan, tmp_path) -> FoldData:
    data = write_fold_data(str(tmp_path / "storage"), "run", 0, plan.train, plan.val, shard_rows=12)
    return dataclasses.replace(data, window=2)


def test_two_workers_read_the_folds_shards_and_train_what_one_process_trains(ray_cluster, tmp_path):
    # 41 molecules, global batch 8: the last global batch holds ONE molecule, so worker 1 gets none and must still
    # run its forward (molecule features included), backward and collectives; MTL adds per-task label counts.
    # Upstream's padding: each worker's share is collated as wide as its global batch, so its sums are the same.
    # The default suite's one 1-vs-2-worker equality on Ray Train (tests/ray_app/finetune/test_train_loop.py has the
    # others, in the slow lane).
    plan = member_plan(8, "upstream", use_mtl_loss=True, n_train=41, features_generator=("rdkit_2d_normalized",))
    assert_only_shift_invariant_noise(plan)
    data = _sharded(plan, tmp_path)
    manifest = json.loads((tmp_path / "storage/run-data/fold_0/train/manifest.json").read_text())
    assert manifest["rows"] == [12, 12, 12, 5] and (tmp_path / "storage/run-data/fold_0/val/manifest.json").exists()
    source = data.train_source()
    assert [len(w) for w in source.plan(plan.seed).windows(0)] == [2, 2]
    single = fit(dataclasses.replace(plan, train=source)).checkpoint()  # the same shards, in this process
    double = _fit(plan, data, 2, tmp_path, "double")
    assert single["progress"]["global_step"] == double["progress"]["global_step"] == 12
    assert_same_training(single, double)


# Runs with -m slow: the multi-node lane kills a node of a real finetune reading these shards (its elastic test resumes
# it on fewer workers, equal to an uninterrupted run)
@pytest.mark.slow
def test_a_run_reading_shards_killed_mid_way_resumes_on_one_worker_to_the_same_result(ray_cluster, tmp_path):
    plan = member_plan(8, "zero", epochs=4)
    data = _sharded(plan, tmp_path)
    reference = fit(dataclasses.replace(plan, train=data.train_source())).checkpoint()
    with killing_a_worker_after_first_checkpoint(tmp_path, "shrunk") as killed:
        with pytest.raises(Exception):  # noqa: B017 - whichever error Ray Train surfaces it as
            _fit(plan, data, 2, tmp_path, "shrunk")
    assert killed and killed[0] < 4, f"no worker was killed mid-run (epochs checkpointed at kill: {killed})"
    resumed = _fit(plan, data, 1, tmp_path, "shrunk")
    assert resumed["progress"]["epoch"] == reference["progress"]["epoch"] == 4
    assert_same_training(reference, resumed)
