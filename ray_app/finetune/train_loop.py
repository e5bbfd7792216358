"""``train_loop_per_worker``: one ensemble member of one fold, trained data-parallel by Ray Train.

The loop itself (epochs, steps, validation, best epoch, early stopping, and what makes N workers equal one process)
is :func:`kermt.train.loop.fit_member`; this adapter gives it what Ray Train provides: the worker's place in the
group, the model restored from the run's last checkpoint (``ray_app.common.worker_loop.start``), and after each
epoch the epoch line and a report with a checkpoint (model, optimizer, scheduler, progress, best-so-far), so a
restarted worker group, of the same size or another (elastic ``MIN-MAX``), loses at most one epoch and changes no
result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch

from kermt.train.loop import BestWeights, MemberPlan, MemberProgress, build_member, fit_member
from kermt.train.optim import NoamLR
from ray_app.common.progress import duration
from ray_app.common.worker_loop import start


def _build(plan: MemberPlan, device: torch.device, rank: int) \
        -> tuple[torch.nn.Module, torch.optim.Optimizer, NoamLR]:
    # a restarted group takes everything from its checkpoint
    return build_member(plan, device, rank, fresh=ray.train.get_checkpoint() is None)


def _epoch_line(plan: MemberPlan, metrics: dict[str, Any], history: list[dict[str, Any]]) -> str:
    """Upstream's epoch line, then how long the epochs left would take at the mean pace so far (early stopping
    may end sooner)."""
    pace = sum(row["train_time_s"] + row["val_time_s"] for row in history) / max(1, len(history))
    left = plan.epochs - metrics["epoch"] - 1
    return (f"[{plan.label}] epoch {metrics['epoch']:4d}  loss_train {metrics['train_loss']:.6f}  "
            f"loss_val {metrics['val_loss']:.6f}  {plan.metric}_val {metrics[f'val_{plan.metric}']:.6f}  "
            f"lr {metrics['lr']:.3e}  t_time {metrics['train_time_s']:.1f}s  v_time {metrics['val_time_s']:.1f}s"
            + (f"  ({left} epoch(s) left, about {duration(left * pace)})" if left > 0 else ""))


def _load_plan(config: dict[str, Any]) -> MemberPlan:
    plan: MemberPlan = config["plan"]
    if "data" in config:  # the fold's shards (ray_app.finetune.fold_data): batches read as needed, and of the val
        data = config["data"]  # split the targets and this rank's chunks (kermt.train.loop.rank_validation)
        plan = dataclasses.replace(plan, train=data.train_source(), val=data.val.validation_source())
    elif "splits" in config:  # the fold's ScaledSplits, put once by the driver for every member of the fold
        splits = ray.get(config["splits"])
        plan = dataclasses.replace(plan, train=splits.train, val=splits.val)
    return plan


def train_loop_per_worker(config: dict[str, Any]) -> None:
    plan = _load_plan(config)
    best = BestWeights()

    def load_weights(model: torch.nn.Module, directory: Path, state: dict[str, Any]) -> None:
        best.restore(model, state)

    training = start(plan.label, lambda device, rank: _build(plan, device, rank), MemberProgress, load_weights)

    def epoch_done(metrics: dict[str, Any], checkpoint: Callable[[], dict[str, Any]]) -> None:
        # Training.report builds the same checkpoint itself, in the directory Ray Train takes it from
        if training.rank == 0:
            print(_epoch_line(plan, metrics, training.progress.history), flush=True)
        training.report(metrics, lambda _: best.saved(training))

    fit_member(plan, training, best, epoch_done)


__all__ = ["MemberPlan", "train_loop_per_worker"]  # MemberPlan: what members.py builds for this loop
