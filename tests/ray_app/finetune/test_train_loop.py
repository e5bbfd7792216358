"""Distributed math equals single-process math: 2 workers x batch b == 1 worker x batch 2b (same parameters), with
dropout and bond dropout on (drawn per molecule: dropout_draws="per_molecule", the runners' default).

The default suite's 1-worker side is the member loop in this process (kermt.train.loop.fit, the loop every Ray Train
worker runs; tests/kermt/train/test_loop.py): what a 1-worker Ray Train run computes, without starting one."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from kermt.train.loop import MemberPlan, fit
from ray_app.common.worker_loop import STATE_FILE
from ray_app.finetune.train_loop import train_loop_per_worker
from tests.kermt.train.member_plans import assert_only_shift_invariant_noise, assert_same_training, member_plan


def _fit(plan: MemberPlan, workers: int, tmp_path, name: str, max_failures: int = 0) -> dict:
    result = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"plan": plan},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path), failure_config=FailureConfig(max_failures)),
    ).fit()
    with result.checkpoint.as_directory() as directory:
        return torch.load(f"{directory}/{STATE_FILE}", weights_only=True)


# Runs with -m slow: the default suite's 1-vs-2-worker equality on Ray Train is tests/ray_app/finetune/
# test_fold_data.py's (the workers reading a fold's shards, with molecule features, MTL's per-task global counts and a
# worker with nothing in the last batch on top of what this checks).
@pytest.mark.slow
@pytest.mark.parametrize("use_mtl_loss", [False, True])
def test_two_workers_equal_one_worker_with_double_batch(ray_cluster, tmp_path, use_mtl_loss):
    plan = member_plan(8, "zero", use_mtl_loss=use_mtl_loss)
    assert_only_shift_invariant_noise(plan)
    single, double = _fit(plan, 1, tmp_path, "single"), _fit(plan, 2, tmp_path, "double")
    # 44 molecules, global batch 8: 6 steps per epoch including a ragged tail of 4 (2 per worker)
    assert single["progress"]["global_step"] == double["progress"]["global_step"] == 12
    assert_same_training(single, double)


# Runs with -m slow: a variance head (--loss mve) trains with each view's Gaussian NLL, reduced by the same global
# label count, so 2 workers still equal 1 with the double batch.
@pytest.mark.slow
def test_two_workers_equal_one_worker_with_a_variance_head(ray_cluster, tmp_path):
    plan = member_plan(8, "zero", variance=True)
    assert_only_shift_invariant_noise(plan)
    single, double = _fit(plan, 1, tmp_path, "single"), _fit(plan, 2, tmp_path, "double")
    assert single["progress"]["global_step"] == double["progress"]["global_step"] == 12
    assert_same_training(single, double)


# Runs with -m slow: the same plan on the same workers, its molecules read from a fold's shards, is the default
# suite's test_fold_data.py test
@pytest.mark.slow
def test_a_worker_with_no_molecules_in_the_last_batch(ray_cluster, tmp_path):
    # 41 molecules, global batch 8: the last global batch holds ONE molecule, so worker 1 gets none and must still
    # run its forward (molecule features included), backward and collectives; MTL adds per-task label counts.
    # Upstream's padding: each worker's share is collated as wide as its global batch, so its sums are the same.
    plan = member_plan(8, "upstream", use_mtl_loss=True, n_train=41, features_generator=("rdkit_2d_normalized",))
    assert_only_shift_invariant_noise(plan)
    single, double = fit(plan).checkpoint(), _fit(plan, 2, tmp_path, "double")
    assert single["progress"]["global_step"] == double["progress"]["global_step"] == 12
    assert_same_training(single, double)


def _kill_one_worker_after_first_checkpoint(storage: Path, name: str, done: threading.Event, killed: list) -> None:
    """Wait until epoch 0's checkpoint exists, then SIGKILL one training worker process."""
    import ray
    from ray.util.state import list_actors

    # this test's cluster by address: with another Ray instance on the machine, an address-less call refuses to pick
    address = ray.get_runtime_context().gcs_address
    while not done.is_set():
        checkpoints = list((storage / name).glob("checkpoint_*"))
        if checkpoints:
            workers = list_actors(address=address,
                                  filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
            if workers:
                os.kill(max(int(w.pid) for w in workers), signal.SIGKILL)
                killed.append(len(checkpoints))
                return
        time.sleep(0.05)


@contextlib.contextmanager
def killing_a_worker_after_first_checkpoint(storage: Path, name: str):
    """While the block runs run ``name``: SIGKILL one of its workers once its first checkpoint exists. Yields the
    list that receives the number of checkpoints at the kill (empty: no kill happened)."""
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_one_worker_after_first_checkpoint, args=(storage, name, done, killed),
                              daemon=True)
    killer.start()
    try:
        yield killed
    finally:
        done.set()
        killer.join(timeout=5)


# Runs with -m slow, as the next one: a SIGKILLed run resumed from its checkpoint is the multi-node lane's (which CI
# runs: tests/multinode/test_cluster_runs.py loses a training node mid-run, and its elastic test resumes on fewer
# workers, each equal to an uninterrupted run). This one keeps torch's dropout draws at an unchanged world size.
@pytest.mark.slow
def test_killed_worker_resumes_and_changes_no_result(ray_cluster, tmp_path):
    plan = dataclasses.replace(member_plan(8, "upstream", epochs=5, dropout=0.1), bond_drop_rate=0.1,
                               dropout_draws="torch")
    reference = _fit(plan, 2, tmp_path, "uninterrupted")

    with killing_a_worker_after_first_checkpoint(tmp_path, "interrupted") as killed:
        resumed = _fit(plan, 2, tmp_path, "interrupted", max_failures=1)
    assert killed and killed[0] < 5, f"no worker was killed mid-run (epochs checkpointed at kill: {killed})"
    assert resumed["progress"]["epoch"] == reference["progress"]["epoch"] == 5
    for name, value in reference["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, rtol=0, atol=1e-6, msg=name)
    assert [h["val_rmse"] for h in resumed["progress"]["history"]] == pytest.approx(
        [h["val_rmse"] for h in reference["progress"]["history"]], abs=1e-7)


@pytest.mark.slow
def test_run_resumed_on_fewer_workers_changes_no_result(ray_cluster, tmp_path):
    """What an elastic run (``--num_workers 1-2``) does when a node goes: the group restarts smaller from the last
    checkpoint. The global batch is part of the plan and the dropout masks are drawn per molecule, so 1 worker
    continues exactly where 2 left off: the run ends as the uninterrupted one (computed in this process)."""
    plan = member_plan(8, "zero", epochs=4)
    reference = fit(plan).checkpoint()

    with killing_a_worker_after_first_checkpoint(tmp_path, "shrunk") as killed:
        # no retries left: the 2-worker run stops at the kill
        with pytest.raises(Exception):  # noqa: B017 - whichever error Ray Train surfaces it as
            _fit(plan, 2, tmp_path, "shrunk")
    assert killed and killed[0] < 4, f"no worker was killed mid-run (epochs checkpointed at kill: {killed})"
    resumed = _fit(plan, 1, tmp_path, "shrunk")  # same run name and storage: resumes from its checkpoint
    assert resumed["progress"]["epoch"] == reference["progress"]["epoch"] == 4
    assert_same_training(reference, resumed)
