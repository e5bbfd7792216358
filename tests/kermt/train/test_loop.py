"""The member loop without Ray: a member fitted in this process learns and keeps its best epoch, resumes from its
checkpoint to the same numbers, and 2 plain gloo processes with batch b each train the parameters of one process
with batch 2b (the equality Ray Train's workers rely on, tests/ray_app/finetune/test_train_loop.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from kermt.train.communicator import SingleProcess, TorchDistributed
from kermt.inference.split import predict_split
from kermt.inference.widths import most_frequent_width, training_width_histogram
from kermt.train.loop import MemberPlan, fit, validation_rule
from kermt.train.step import predict, validation_loss
from tests.conftest import free_port
from tests.gloo import gloo_group
from tests.kermt.train.member_plans import assert_only_shift_invariant_noise, assert_same_training, member_plan


def test_a_member_fitted_in_one_process_learns_and_keeps_its_best_epoch():
    plan = dataclasses.replace(member_plan(8, "zero", epochs=4), select_by_loss=True)
    member = fit(plan)
    history = member.history
    assert [row["epoch"] for row in history] == [0, 1, 2, 3]
    assert history[-1]["train_loss"] < 0.9 * history[0]["train_loss"]
    losses = [row["val_loss"] for row in history]
    best = int(np.argmin(losses))
    assert history[-1]["best_epoch"] == best == member.training.progress.best_epoch
    assert member.training.progress.best_value == min(losses)
    assert member.training.progress.global_step == 4 * 6  # 44 molecules, global batch 8: 6 steps an epoch
    # the best model holds the best epoch's weights: scored again, it gives that epoch's validation loss
    model = member.best_model()
    preds = predict(model, plan.val, np.arange(len(plan.val)), plan.global_batch_size)
    rescored = validation_loss(preds, plan.val.targets.astype(np.float64), plan.global_batch_size, "regression")
    assert rescored == pytest.approx(min(losses), rel=1e-9)


def test_a_bf16_member_trains_and_validates_close_to_the_fp32_one():
    """``precision="bf16"``: every training and validation forward of the member loop under bf16 autocast (what
    `kermt finetune --precision bf16` hands each Ray Train worker; the end-to-end run is in the slow lane,
    tests/ray_app/finetune/test_finetune.py): a different computation, its scores within a few percent."""
    plan = member_plan(8, "zero", epochs=1)
    runs = {precision: fit(dataclasses.replace(plan, precision=precision)).history for precision in ("fp32", "bf16")}
    for name in ("train_loss", "val_loss", "val_rmse"):
        fp32, bf16 = ([row[name] for row in runs[p]] for p in ("fp32", "bf16"))
        assert bf16 != fp32, name  # autocast really ran
        assert bf16 == pytest.approx(fp32, rel=0.05), name


def test_an_upstream_padded_member_is_validated_as_its_saved_model_will_predict():
    """Validation computes each molecule at the reference width the member records (kermt predict's rule for the
    saved model), not at the width of a chunk of consecutive validation rows (global batch 2: chunks of two
    molecules, whose own width is often below the recorded one)."""
    plan = dataclasses.replace(member_plan(2, "upstream", epochs=2), select_by_loss=True)
    rule = validation_rule(plan)
    histogram = training_width_histogram(plan.train.graphs, plan.seed, plan.epochs, plan.global_batch_size)
    assert rule.reference_width == most_frequent_width(histogram) and not rule.upstream_batching
    member = fit(plan)
    model, targets = member.best_model(), plan.val.targets.astype(np.float64)
    chunk = plan.global_batch_size
    at_width, _ = predict_split(model, plan.val, chunk, rule)
    consecutive = predict(model, plan.val, np.arange(len(plan.val)), chunk)
    best = member.training.progress.best_value
    assert validation_loss(at_width, targets, chunk, "regression") == pytest.approx(best, rel=1e-9)
    assert abs(validation_loss(consecutive, targets, chunk, "regression") - best) > 1e-6 * best


def test_early_stopping_ends_after_the_epochs_without_improvement():
    plan = dataclasses.replace(member_plan(8, "zero", epochs=6), early_stop_epoch=1, select_by_loss=True)
    history = fit(plan).history
    best = [row["best_epoch"] for row in history]
    # it stops at the first epoch that does not improve on the best so far, before the plan's last epoch
    assert len(history) < plan.epochs
    assert best[-1] == len(history) - 2 and best[:-1] == list(range(len(history) - 1))


def test_a_member_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(tmp_path):
    plan = member_plan(8, "zero", epochs=3)
    saved = tmp_path / "epoch1.pt"

    def save_after_epoch_1(metrics: dict[str, Any], checkpoint) -> None:
        if metrics["epoch"] == 1:
            torch.save(checkpoint(), saved)

    uninterrupted = fit(plan, epoch_done=save_after_epoch_1)
    resumed = fit(plan, checkpoint=torch.load(saved, weights_only=True))
    assert resumed.training.progress.epoch == uninterrupted.training.progress.epoch == 3
    for name, value in uninterrupted.checkpoint()["model"].items():
        assert torch.equal(resumed.checkpoint()["model"][name], value), name
    timed = ("train_time_s", "val_time_s")

    def strip(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k not in timed} for row in rows]

    assert strip(resumed.history) == strip(uninterrupted.history)


def _gloo_rank(rank: int, world: int, port: int, plan: MemberPlan, out: Path) -> None:
    """One of ``world`` plain processes: the kermt loop over gloo; rank 0 saves the member's checkpoint."""
    torch.set_num_threads(1)
    with gloo_group(rank, world, port):
        member = fit(plan, TorchDistributed.current())
        if rank == 0:
            torch.save(member.checkpoint(), out)


@pytest.mark.parametrize("use_mtl_loss", [False, True])
def test_two_gloo_processes_equal_one_process_with_the_double_batch(tmp_path, use_mtl_loss):
    # 41 molecules, global batch 8 (4 per rank): the last global batch holds one molecule, so rank 1 has none there
    plan = member_plan(8, "upstream", use_mtl_loss=use_mtl_loss, n_train=41)
    assert_only_shift_invariant_noise(plan)
    out = tmp_path / "two.pt"
    mp.spawn(_gloo_rank, args=(2, free_port(), plan, out), nprocs=2, join=True)
    single = fit(plan, SingleProcess()).checkpoint()
    double = torch.load(out, weights_only=True)
    assert single["progress"]["global_step"] == double["progress"]["global_step"] == 12
    assert_same_training(single, double)
