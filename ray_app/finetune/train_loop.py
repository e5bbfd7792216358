"""``train_loop_per_worker``: one ensemble member of one fold, trained data-parallel by Ray Train.

What makes N workers equal to one process (docs/architecture.md decision 4):
- the epoch's batch plan depends only on (n, global batch, seed, epoch); each worker takes a slice of global batch k
  (the global batch is fixed by the plan, so an elastic run that resizes between restarts keeps it);
- the loss is normalised by the GLOBAL label count, the LR schedule counts global steps;
- dynamic depth is drawn from (seed, global step), identically on every rank; bond dropout and (by default,
  ``dropout_draws="per_molecule"``) every dropout mask from (seed, global step, molecule), so a molecule sees the
  same masks whichever rank trains it;
- validation predicts fixed chunks of the global batch size, spread over ranks and gathered, so every rank scores
  the same predictions and takes the same best-model and early-stopping decisions.
Fault tolerance: rank 0 reports a checkpoint every epoch (model, optimizer, scheduler, progress, best-so-far);
a restarted worker group resumes from it and draws what the lost one would have drawn, so a lost worker costs at
most one epoch and changes no result, also when the group restarts with a different size (elastic ``MIN-MAX``).
With ``dropout_draws="torch"`` (upstream's masks) torch's RNG is seeded per (seed, epoch, rank): a restart of the
same size still changes nothing, but the masks follow the ranks, so another world size differs by that draw.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import ray.train
import ray.train.torch
import torch

from kermt.config import FinetuneModelConfig
from kermt.data.dataset import MoleculeBatch, MoleculeSet, bond_keep_mask
from kermt.data.prefetch import prefetch
from kermt.data.sampling import epoch_order, global_batches, worker_share
from kermt.data.scalers import StandardScaler
from kermt.random_streams import Stream, depth_rng, stream_seed
from kermt.nn.finetune import KermtFinetuneModel
from kermt.train.optim import NoamLR
from kermt.train.step import FinetuneStepSettings, predict, score, snapshot, train_step, validation_loss
from ray_app.common.progress import duration
from ray_app.common.worker_loop import LoopProgress, Training, all_gather, all_reduce, optimizer_and_scheduler, start
from ray_app.finetune.objective import Objective

if TYPE_CHECKING:
    from ray_app.finetune.run_setup import StartingWeights


@dataclass(frozen=True, kw_only=True)  # by name: eight floats in a row must not be swappable by position
class MemberPlan:
    """Everything a worker needs to train one member; shipped once through the object store.

    ``train``/``val`` are None when the fold's data travels separately (``train_loop_config["splits"]``: one
    object per fold, shared by every member of the fold and read zero-copy by each worker)."""

    model_config: FinetuneModelConfig
    initial_state: dict[str, torch.Tensor] | StartingWeights  # StartingWeights: built by the workers themselves
    train: MoleculeSet | None
    val: MoleculeSet | None
    target_scaler: StandardScaler | None
    seed: int
    epochs: int
    global_batch_size: int  # molecules per optimizer step, split over whoever runs
    init_lr: float
    max_lr: float
    final_lr: float
    warmup_epochs: float
    weight_decay: float
    fine_tune_coff: float
    dist_coff: float
    bond_drop_rate: float
    metric: str
    select_by_loss: bool
    early_stop_epoch: int
    label: str  # names the member in log lines
    precision: str  # "bf16": forward under autocast (kermt.nn.precision)
    dropout_draws: str  # "torch": upstream's masks from torch's RNG (kermt.nn.keyed_dropout)

    @property
    def objective(self) -> Objective:
        """What the best epoch is chosen by (and early stopping counts epochs without improvement of)."""
        return Objective.of(self.metric, self.select_by_loss)


@dataclass
class MemberProgress(LoopProgress):
    """Also the best epoch so far (by the plan's objective) and the epochs since it (early stopping)."""

    best_value: float = float("nan")
    best_epoch: int = -1
    bad_epochs: int = 0


@dataclass
class BestWeights:
    """The best epoch's weights so far. A checkpoint holds None for them when that epoch is its own (its model)."""

    weights: dict[str, torch.Tensor] | None = None

    def restore(self, model: torch.nn.Module, directory: Path, state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        self.weights = state["best_state"] if state["best_state"] is not None else snapshot(model)

    def saved(self, training: Training[MemberProgress]) -> dict[str, Any]:
        progress = training.progress
        is_best_now = progress.best_epoch == progress.epoch - 1
        return {"model": training.core.state_dict(), "best_state": None if is_best_now else self.weights}


def _build(plan: MemberPlan, device: torch.device) -> tuple[KermtFinetuneModel, torch.optim.Optimizer, NoamLR]:
    model = KermtFinetuneModel(plan.model_config)
    if ray.train.get_checkpoint() is None:  # a restarted group takes everything from its checkpoint
        model.load_state_dict(_starting_state(plan))
    model.to(device)
    optimizer, scheduler = optimizer_and_scheduler(model, plan, len(plan.train) // plan.global_batch_size,
                                                   plan.fine_tune_coff)
    return model, optimizer, scheduler


def _starting_state(plan: MemberPlan) -> dict[str, torch.Tensor]:
    """The given state dict, or the one a :class:`StartingWeights` builds here from the shared checkpoint (every
    rank builds the same one; rank 0 says what was loaded)."""
    if isinstance(plan.initial_state, dict):
        return plan.initial_state
    state, summary = plan.initial_state.build(plan.model_config)
    if ray.train.get_context().get_world_rank() == 0:
        print("\n".join(f"{plan.label}: {line}" for line in summary.splitlines()), flush=True)  # each line its own
    return state


def _worker_batches(plan: MemberPlan, model: KermtFinetuneModel, steps: list[np.ndarray], rank: int, world: int,
                    first_step: int) -> Iterator[MoleculeBatch]:
    """This worker's batch of every global batch of the epoch, on the CPU: its neighbour-sum operators built here
    (numpy, no host-device sync in the step), the global batch's label counts counted here (no collective), its
    bond dropout drawn per molecule from (seed, global step, molecule, bond), and its neighbour tables as wide as
    the global batch's (with upstream's padding the width enters every sum: N workers then equal one process)."""
    operators = model.kermt.aggregation_spec(training=True)
    for index, global_rows in enumerate(steps):
        rows = worker_share(global_rows, rank, world)  # empty on some ranks when the last global batch is short
        keep = global_keep = None
        if plan.bond_drop_rate > 0:  # keyed per (molecule, bond): the share's flags are its part of the global ones
            keep, global_keep = (bond_keep_mask(part, plan.train.graphs.bond_counts, plan.bond_drop_rate, plan.seed,
                                                first_step + index) for part in (rows, global_rows))
        width = plan.train.neighbour_width(global_rows, global_keep)
        yield plan.train.batch(rows, keep, operators=operators, global_rows=global_rows, neighbour_width=width)


def _train_epoch(plan: MemberPlan, training: Training[MemberProgress]) -> dict[str, float]:
    """Train one epoch; returns ``train_loss`` (the label loss over every label of the epoch, without MTL weights)
    and, with MTL, ``train_objective`` (the mean over steps of the loss the optimiser minimised)."""
    model, progress, rank, world = training.model, training.progress, training.rank, training.world
    settings = FinetuneStepSettings(plan.model_config.head.dataset_type, plan.dist_coff, plan.model_config.use_mtl_loss,
                            precision=plan.precision, dropout_draws=plan.dropout_draws, seed=plan.seed)
    # used by dropout_draws="torch" only: a restarted group of the same size draws what the lost one drew
    torch.manual_seed(stream_seed(plan.seed, Stream.FINETUNE_TORCH, progress.epoch, rank))
    model.train()
    order = epoch_order(len(plan.train), plan.seed, progress.epoch)
    # [local label-loss sum, local objective share, global label count]: summed on the device, read once per epoch
    sums = torch.zeros(3, dtype=torch.float64, device=training.device)
    steps = global_batches(order, plan.global_batch_size)
    batches = _worker_batches(plan, training.core, steps, rank, world, progress.global_step)
    for batch in prefetch(batches, training.device):  # the next batches are collated while this step computes
        step = train_step(model, training.optimizer, training.scheduler, batch, settings,
                          depth_rng(plan.seed, progress.global_step), world, all_reduce, progress.global_step)
        sums += torch.stack([step.label_loss_sum, step.objective_share, step.label_count]).to(sums)
        progress.global_step += 1
    label_count = float(sums[2])  # already global: every rank holds the same value
    total = all_reduce(sums[:2].clone())
    metrics = {"train_loss": float(total[0]) / max(label_count, 1.0)}
    if settings.use_mtl_loss:
        metrics["train_objective"] = float(total[1]) / max(len(steps), 1)
    return metrics


def _validate(plan: MemberPlan, training: Training[MemberProgress]) -> dict[str, float]:
    """Val loss and metric over every val molecule exactly once, identical on every rank."""
    model, rank, world = training.model, training.rank, training.world
    chunk = plan.global_batch_size
    chunks = global_batches(np.arange(len(plan.val)), chunk)
    mine = [c for i, c in enumerate(chunks) if i % world == rank]
    local = {i * world + rank: predict(model, plan.val, c, chunk, plan.precision) for i, c in enumerate(mine)}
    merged: dict[int, np.ndarray] = {}
    for part in all_gather(local, world):
        merged.update(part)
    width = plan.val.targets.shape[1]
    preds = np.concatenate([merged[i] for i in range(len(chunks))]) if chunks else np.zeros((0, width))
    targets = plan.val.targets.astype(np.float64)
    value, _ = score(preds, targets, plan.metric, plan.model_config.head.dataset_type, plan.target_scaler)
    loss = validation_loss(preds, targets, chunk, plan.model_config.head.dataset_type)
    return {"val_loss": loss, f"val_{plan.metric}": value}


def _epoch(plan: MemberPlan, training: Training[MemberProgress]) -> dict[str, Any]:
    """Train one epoch and validate: the epoch's row of the history (without its best epoch yet)."""
    started = time.perf_counter()
    train_metrics = _train_epoch(plan, training)
    trained = time.perf_counter()
    return {"epoch": training.progress.epoch, **train_metrics, **_validate(plan, training),
            "lr": training.scheduler.get_last_lr()[-1], "train_time_s": trained - started,
            "val_time_s": time.perf_counter() - trained}


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
    plan: MemberPlan = ray.get(config["plan"]) if isinstance(config["plan"], ray.ObjectRef) else config["plan"]
    if "splits" in config:  # the fold's ScaledSplits, put once by the driver for every member of the fold
        splits = ray.get(config["splits"])
        plan = dataclasses.replace(plan, train=splits.train, val=splits.val)
    return plan


def train_loop_per_worker(config: dict[str, Any]) -> None:
    plan = _load_plan(config)
    best = BestWeights()
    training = start(plan.label, lambda device: _build(plan, device), MemberProgress, best.restore)
    if best.weights is None:  # a fresh start: the starting model is the best so far
        best.weights = snapshot(training.model)
    progress, objective = training.progress, plan.objective
    while progress.epoch < plan.epochs and progress.bad_epochs < plan.early_stop_epoch:
        metrics = _epoch(plan, training)
        if objective.better(metrics[objective.key], progress.best_value):
            progress.best_value, progress.best_epoch, progress.bad_epochs = metrics[objective.key], progress.epoch, 0
            best.weights = snapshot(training.model)
        else:
            progress.bad_epochs += 1
        metrics["best_epoch"] = progress.best_epoch
        progress.history.append(metrics)
        progress.epoch += 1
        if training.rank == 0:
            print(_epoch_line(plan, metrics, progress.history), flush=True)
        training.report(metrics, lambda _: best.saved(training))
