"""Pretraining's step loop without Ray: in one process it logs and validates at the plan's intervals, reports at
its save intervals, and a run resumed from a report's checkpoint ends with the uninterrupted run's weights (the
equality across world sizes is the step's: tests/kermt/pretrain/test_step.py)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from kermt.data.shard_plan import ShardPlan
from kermt.nn.pretrain.config import PretrainLossConfig
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.pretrain.loop import PretrainPlan, PretrainProgress, build_pretrain, fit_pretrain
from kermt.train.communicator import SingleProcess
from kermt.train.state import TrainingState, checkpoint_state, restore
from tests.kermt.pretrain.tiny_corpus import TINY_ENCODER, fixture_smiles, tiny_arrays, tiny_heads

DATA, SIZES = tiny_arrays(fixture_smiles())  # 26 molecules
SHARDS = [DATA.arrays.take(np.arange(a, b)) for a, b in ((0, 6), (6, 11), (11, 20), (20, 26))]  # read by index


def _plan() -> PretrainPlan:
    heads = tiny_heads("hybrid", SIZES)
    torch.manual_seed(0)
    model = KermtPretrainModel(TINY_ENCODER, heads)
    return PretrainPlan(
        encoder=TINY_ENCODER, heads=heads, loss=PretrainLossConfig(), initial_state=model.state_dict(),
        shards=ShardPlan(tuple(len(s) for s in SHARDS), seed=3, val_fraction=0.23, window=2), seed=3, epochs=2,
        global_batch_size=5, init_lr=1e-4,
        max_lr=1e-3, final_lr=1e-4, warmup_epochs=1.0, weight_decay=0.0, save_interval=3, val_interval=0,
        train_interval=2, max_val_batches=2, stop_after_steps=None, per_rank_loss=False, dropout_draws="per_molecule",
        precision="fp32")


def _training(plan: PretrainPlan, checkpoint: dict[str, Any] | None = None) -> TrainingState[PretrainProgress]:
    model, optimizer, scheduler = build_pretrain(plan, torch.device("cpu"))
    progress = PretrainProgress()
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        progress = restore(optimizer, scheduler, checkpoint, PretrainProgress)
    return TrainingState(model, optimizer, scheduler, progress, SingleProcess(), torch.device("cpu"))


def test_a_pretraining_resumed_from_a_reported_checkpoint_ends_as_the_uninterrupted_one():
    plan = _plan()
    training = _training(plan)
    reports: list[dict[str, float]] = []
    saved: dict[int, bytes] = {}

    def report(metrics: dict[str, float]) -> None:
        reports.append(metrics)
        state = checkpoint_state(training, {"model": training.core.state_dict()})
        buffer = io.BytesIO()
        torch.save(state, buffer)
        saved[int(metrics["global_step"])] = buffer.getvalue()

    fit_pretrain(plan, SHARDS.__getitem__, training, report)
    # 20 training molecules (6 held out), global batch 5: 4 steps an epoch; reports every 3 steps and at epoch ends
    assert [int(r["global_step"]) for r in reports] == [3, 4, 6, 8]
    history = training.progress.history
    assert [row["step"] for row in history] == [2, 4, 6, 8]  # every 2 steps, and validation at the epoch ends
    assert [("val_loss" in row) for row in history] == [False, True, False, True]
    assert history[-1]["train_loss"] < history[0]["train_loss"]

    checkpoint = torch.load(io.BytesIO(saved[3]), weights_only=True)
    resumed = _training(plan, checkpoint)
    assert (resumed.progress.epoch, resumed.progress.batch_idx) == (0, 3)
    fit_pretrain(plan, SHARDS.__getitem__, resumed, lambda metrics: None)
    assert resumed.progress.global_step == 8
    for name, value in training.core.state_dict().items():
        assert torch.equal(resumed.core.state_dict()[name], value), name
