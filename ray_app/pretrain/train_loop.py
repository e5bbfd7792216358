"""``train_loop_per_worker`` of `kermt pretrain`: Ray Train runs it on every worker of the group.

What makes N workers equal one process (docs/architecture.md, "Distributed math equals single-process math"):
the epoch's batch plan depends only on (seed, epoch) and the fixed global batch; each worker takes its contiguous
share; :class:`kermt.pretrain.step.PretrainStep` normalises every term by global counts and draws the cMIM
negatives from the gathered global batch; masks, latent ε, depths and (``dropout_draws="per_molecule"``, the
default) dropout come from (seed, global step, molecule).

Fault tolerance: rank 0 reports a Ray Train checkpoint (native weights, optimizer, scheduler, progress = epoch,
batch index and global step) every ``save_interval`` steps and at every epoch end. A restarted group, a re-run of
the same command after the driver died, or a group of another size (elastic) continues at the next batch of the
plan with the same draws, so it ends with the weights of an uninterrupted run. Torch's RNG is seeded per (seed,
step, rank) for what still draws from it (``dropout_draws="torch"``, the sinusoidal decoder's PyTorch layers):
those masks follow the ranks, so there the equality across world sizes needs their dropout at 0.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from kermt.checkpoint import load_native
from kermt.config import EncoderConfig
from kermt.data.operators import OperatorSpec
from kermt.data.prefetch import prefetch
from kermt.data.sampling import epoch_order, global_batches
from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer
from kermt.pretrain.batch import PretrainData, StepBatch, build_step_batch
from kermt.pretrain.export import save_pretrain_native
from kermt.pretrain.step import Distribution, PretrainStep, PretrainStepSettings, all_gather_with_grad
from kermt.random_streams import Stream, stream_seed
from ray_app.common.train_worker import all_reduce, print_placement, quiet_report_logs

STATE_FILE = "training_state.pt"
MODEL_DIR = "model"
VAL_STEP_BASE = 2**40  # validation draws use "steps" no training step reaches, so they never change


@dataclass(frozen=True)
class PretrainPlan:
    """Everything a worker needs, shipped once through the object store (the corpus travels separately)."""

    encoder: EncoderConfig
    heads: PretrainHeadsConfig
    loss: PretrainLossConfig
    initial_state: dict[str, torch.Tensor]
    train_rows: np.ndarray
    val_rows: np.ndarray
    seed: int
    epochs: int
    global_batch_size: int
    init_lr: float
    max_lr: float
    final_lr: float
    warmup_epochs: float
    weight_decay: float
    save_interval: int
    val_interval: int
    train_interval: int
    max_val_batches: int
    stop_after_steps: int | None = None
    per_rank_loss: bool = False
    dropout_draws: str = "per_molecule"  # "torch": torch's RNG, as upstream (kermt.nn.keyed_dropout)
    precision: str = "fp32"  # "bf16": forwards under bfloat16 autocast (kermt.nn.precision)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """Corpus rows of every global batch of ``epoch``."""
        order = self.train_rows[epoch_order(len(self.train_rows), self.seed, epoch)]
        return global_batches(order, self.global_batch_size)


@dataclass
class Progress:
    """Where the run stands: the next batch is ``batch_idx`` of ``epoch``; ``history``: logged metric rows."""

    epoch: int = 0
    batch_idx: int = 0
    global_step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


def _build(plan: PretrainPlan, device: torch.device) -> tuple[KermtPretrainModel, torch.optim.Optimizer, NoamLR]:
    model = KermtPretrainModel(plan.encoder, plan.heads)
    model.load_state_dict(plan.initial_state)
    model.to(device)  # before the optimizer exists, so restored Adam state lands next to its parameters
    optimizer = build_optimizer(model, plan.init_lr, plan.weight_decay, 1.0)
    schedule = NoamSchedule(plan.warmup_epochs, plan.epochs, len(plan.train_rows) // plan.global_batch_size,
                            plan.init_lr, plan.max_lr, plan.final_lr)
    return model, optimizer, NoamLR(optimizer, schedule)


def _restore(model: KermtPretrainModel, optimizer, scheduler, device: torch.device) -> Progress:
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return Progress()
    with checkpoint.as_directory() as directory:
        model.load_state_dict(load_native(Path(directory) / MODEL_DIR).state_dict)
        state = torch.load(Path(directory) / STATE_FILE, weights_only=True, map_location=device)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return Progress(**state["progress"])


def _report(plan: PretrainPlan, model, optimizer, scheduler, progress: Progress, metrics: dict) -> None:
    """Every rank reports (ray.train.report is collective); rank 0 attaches the checkpoint."""
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            core = getattr(model, "module", model)
            save_pretrain_native(Path(directory) / MODEL_DIR, core, plan.loss)
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "progress": asdict(progress)}, os.path.join(directory, STATE_FILE))
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report({"epoch": progress.epoch, "global_step": progress.global_step, **metrics},
                         checkpoint=checkpoint)


class _Interval:
    """Shares summed on the device between two log lines; read (all-reduced) once per interval."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps, self.started = 0, time.perf_counter()

    def add(self, shares: dict[str, torch.Tensor]) -> None:
        for name, value in shares.items():
            self.sums[name] = self.sums[name] + value if name in self.sums else value.clone()
        self.steps += 1

    def read(self, prefix: str, molecules: int) -> dict[str, float]:
        """Mean over the interval's steps of each global term; resets."""
        if not self.steps:
            return {}
        names = sorted(self.sums)
        totals = all_reduce(torch.stack([self.sums[n].double() for n in names])).tolist()
        values = {f"{prefix}_{n}": total / self.steps for n, total in zip(names, totals)}
        if prefix == "train":
            values["molecules_per_s"] = molecules / max(time.perf_counter() - self.started, 1e-9)
        self.__init__()
        return values


def _validate(plan: PretrainPlan, data: PretrainData, trainer: PretrainStep, device) -> dict[str, float]:
    """Mean global terms over the fixed validation batches (eval mode; identical on every rank)."""
    interval = _Interval()
    batches = global_batches(plan.val_rows, plan.global_batch_size)[:plan.max_val_batches]
    operators = trainer.core.encoder.aggregation_spec(training=False)
    for i, step in enumerate(prefetch(_step_batches(plan, data, batches, VAL_STEP_BASE, operators), device)):
        interval.add(trainer.evaluate(step, VAL_STEP_BASE + i))
    return interval.read("val", 0)


def _step_batches(plan: PretrainPlan, data: PretrainData, batches: list[np.ndarray], first_step: int,
                  operators: OperatorSpec) -> Iterator[StepBatch]:
    """This worker's share of each global batch in ``batches`` (global steps ``first_step``, ``first_step + 1``,
    ...), with the encoder's neighbour-sum operators: built on the host, ahead of the step (prefetch)."""
    ctx = ray.train.get_context()  # read in the caller's thread; the batches are built in prefetch's
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    return (build_step_batch(data, rows, rank, world, plan.heads, plan.seed, first_step + i, operators=operators)
            for i, rows in enumerate(batches))


LOGGED = ("loss", "av", "bv", "fg", "cmim", "recon", "recon_accuracy")  # the log line; metrics.csv has every term


def _log_line(progress: Progress, metrics: dict[str, float], lr: float) -> str:
    shown = [f"{name} {metrics[f'train_{name}']:.4f}" for name in LOGGED if f"train_{name}" in metrics]
    shown += [f"val_loss {metrics['val_loss']:.4f}"] if "val_loss" in metrics else []
    speed = f"  {metrics['molecules_per_s']:.0f} mol/s" if "molecules_per_s" in metrics else ""
    return (f"[pretrain] epoch {progress.epoch:3d} step {progress.global_step:6d}  " + "  ".join(shown)
            + f"  lr {lr:.3e}{speed}")


def _step_seed(seed: int, global_step: int, rank: int) -> int:
    """Torch's RNG per (seed, step, rank) (dropout_draws "torch"): a resumed run draws what the uninterrupted one
    drew."""
    return stream_seed(seed, Stream.PRETRAIN_TORCH, global_step, rank)


def _trainer(plan: PretrainPlan, model: torch.nn.Module, optimizer, scheduler) -> PretrainStep:
    ctx = ray.train.get_context()
    world, rank = ctx.get_world_size(), ctx.get_world_rank()
    distribution = Distribution()
    if world > 1:
        # its own group: the gather's backward never interleaves with DDP's gradient all-reduces
        distribution = Distribution(world, rank, all_gather_with_grad(dist.new_group()))
    settings = PretrainStepSettings(plan.seed, plan.loss, plan.per_rank_loss, plan.dropout_draws, plan.precision)
    return PretrainStep(model, optimizer, scheduler, settings, distribution)


def _after_step(plan: PretrainPlan, data: PretrainData, state: dict[str, Any], epoch_end: bool) -> bool:
    """Log, validate and checkpoint as the intervals say; returns whether the run stops here."""
    progress, trainer = state["progress"], state["trainer"]
    step = progress.global_step
    stop = plan.stop_after_steps is not None and step >= plan.stop_after_steps
    metrics: dict[str, float] = {}
    if step % plan.train_interval == 0 or epoch_end or stop:
        metrics.update(state["interval"].read("train", state["interval"].steps * plan.global_batch_size))
    if len(plan.val_rows) and ((plan.val_interval and step % plan.val_interval == 0) or epoch_end):
        metrics.update(_validate(plan, data, trainer, state["device"]))
    if metrics:
        lr = trainer.scheduler.get_last_lr()[0]
        progress.history.append({"epoch": progress.epoch, "step": step, "lr": lr, **metrics})
        if ray.train.get_context().get_world_rank() == 0:
            print(_log_line(progress, metrics, lr), flush=True)
    if step % plan.save_interval == 0 or epoch_end or stop:
        _report(plan, trainer.model, trainer.optimizer, trainer.scheduler, progress, metrics)
    if metrics:
        state["interval"].started = time.perf_counter()  # molecules/s counts training time, not validation's
    return stop


def train_loop_per_worker(config: dict[str, Any]) -> None:
    quiet_report_logs()
    plan: PretrainPlan = ray.get(config["plan"])
    data = PretrainData.of(ray.get(config["corpus"]))  # zero-copy views of the node's one copy
    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device()
    model, optimizer, scheduler = _build(plan, device)
    progress = _restore(model, optimizer, scheduler, device)
    trainer = _trainer(plan, ray.train.torch.prepare_model(model), optimizer, scheduler)
    print_placement("pretrain", progress.epoch, rank)
    if progress.global_step and rank == 0:
        print(f"[pretrain] resuming at step {progress.global_step} (epoch {progress.epoch}, batch "
              f"{progress.batch_idx})", flush=True)
    state = {"progress": progress, "trainer": trainer, "interval": _Interval(), "device": device}
    operators = model.encoder.aggregation_spec(training=True)
    while progress.epoch < plan.epochs:
        batches = plan.epoch_batches(progress.epoch)
        if not batches:
            raise ValueError("the pretraining plan has no training molecules")
        remaining = _step_batches(plan, data, batches[progress.batch_idx:], progress.global_step, operators)
        for step in prefetch(remaining, device):  # the next batches are built while this step computes
            if plan.stop_after_steps is not None and progress.global_step >= plan.stop_after_steps:
                return
            torch.manual_seed(_step_seed(plan.seed, progress.global_step, rank))
            state["interval"].add(trainer.train(step, progress.global_step))
            progress.global_step += 1
            progress.batch_idx += 1
            epoch_end = progress.batch_idx == len(batches)
            if epoch_end:
                progress.epoch, progress.batch_idx = progress.epoch + 1, 0
            if _after_step(plan, data, state, epoch_end):
                return


__all__ = ["MODEL_DIR", "PretrainPlan", "Progress", "STATE_FILE", "train_loop_per_worker"]
