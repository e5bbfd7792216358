"""Pretraining's step loop: every rank of a group walks the epochs' global batches, logs, validates and
reports (a checkpoint) at the plan's intervals, whatever runs the ranks; Ray Train's workers run it through
``ray_app/pretrain/train_loop.py``, which adds Ray's checkpoints as the ``report`` hook.

What makes N ranks equal one process (docs/architecture.md, "Distributed math equals single-process math"):
the epoch's batch plan depends only on (seed, epoch), the corpus's shards and the fixed global batch
(:mod:`kermt.data.shard_plan`); every rank reads the shards of the whole global batch
(:mod:`kermt.data.shard_stream`) and takes its contiguous share; :class:`kermt.pretrain.step.PretrainStep`
normalises every term by global counts and draws the cMIM negatives from the gathered global batch; masks,
latent ε, depths and (``dropout_draws="per_molecule"``, the default) dropout come from (seed, global step,
molecule).

Resuming: the progress (epoch, batch index and global step) is reported every ``save_interval`` steps and at every
epoch end with the weights, optimizer and scheduler. A group restored from it (of any size) continues at the next
batch of the plan with the same draws, so it ends with the weights of an uninterrupted run. Torch's RNG is seeded
per (seed, step, rank) for what still draws from it (``dropout_draws="torch"``, the sinusoidal decoder's PyTorch
layers): those masks follow the ranks, so there the equality across world sizes needs their dropout at 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from kermt.config import EncoderConfig
from kermt.data.operators import OperatorSpec
from kermt.data.prefetch import prefetch
from kermt.data.shard_plan import ShardPlan
from kermt.data.shard_stream import Load, Rows, epoch_batches, validation_batches
from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.pretrain.batch import PretrainData, StepBatch, build_step_batch
from kermt.pretrain.step import Distribution, PretrainStep, PretrainStepSettings, all_gather_with_grad
from kermt.random_streams import Stream, stream_seed
from kermt.train.optim import NoamLR, optimizer_and_scheduler
from kermt.train.state import LoopProgress, TrainingState
from kermt.train.step import AllReduce

VAL_STEP_BASE = 2**40  # validation draws use "steps" no training step reaches, so they never change


@dataclass(frozen=True, kw_only=True)  # by name: the schedule's floats in a row must not be swappable by position
class PretrainPlan:
    """Everything a worker needs, shipped once through the object store (each worker reads the corpus's shards
    itself, as ``shards`` plans them). The settings are PretrainConfig's, which declares their defaults."""

    encoder: EncoderConfig
    heads: PretrainHeadsConfig
    loss: PretrainLossConfig
    initial_state: dict[str, torch.Tensor]
    shards: ShardPlan  # the corpus's shards: validation rows and every epoch's order
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
    stop_after_steps: int | None  # None: train every epoch
    per_rank_loss: bool
    dropout_draws: str  # "torch": torch's RNG, as upstream (kermt.nn.keyed_dropout)
    precision: str  # "bf16": forwards under bfloat16 autocast (kermt.nn.precision)

    @property
    def steps_per_epoch(self) -> int:
        return self.shards.batch_count(self.global_batch_size)


@dataclass
class PretrainProgress(LoopProgress):
    """Also where in the epoch the run stands: its next batch is ``batch_idx`` of ``epoch``."""

    batch_idx: int = 0


def build_pretrain(plan: PretrainPlan, device: torch.device) \
        -> tuple[KermtPretrainModel, torch.optim.Optimizer, NoamLR]:
    """The plan's model on ``device`` with its starting weights, its optimizer and scheduler."""
    model = KermtPretrainModel(plan.encoder, plan.heads)
    model.load_state_dict(plan.initial_state)
    model.to(device)
    return model, *optimizer_and_scheduler(model, plan, plan.shards.n_train // plan.global_batch_size)


class _Interval:
    """Shares summed on the device between two log lines; read (all-reduced) once per interval."""

    def __init__(self, all_reduce: AllReduce) -> None:
        self.all_reduce = all_reduce
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
        totals = self.all_reduce(torch.stack([self.sums[n].double() for n in names])).tolist()
        values = {f"{prefix}_{n}": total / self.steps for n, total in zip(names, totals)}
        if prefix == "train":
            values["molecules_per_s"] = molecules / max(time.perf_counter() - self.started, 1e-9)
        self.__init__(self.all_reduce)
        return values


@dataclass
class _Run:
    """One rank's pretraining: the plan, how it reads a shard, the training state, its step, the log interval's
    sums and the validation batches (read at the first validation, then kept: at most ``max_val_batches``)."""

    plan: PretrainPlan
    load: Load
    training: TrainingState[PretrainProgress]
    trainer: PretrainStep
    interval: _Interval
    val_batches: list[Rows] | None = None


def _validate(run: _Run) -> dict[str, float]:
    """Mean global terms over the fixed validation batches (eval mode; identical on every rank)."""
    interval = _Interval(run.training.communicator.all_reduce)
    if run.val_batches is None:
        run.val_batches = validation_batches(run.plan.shards, run.plan.global_batch_size, run.plan.max_val_batches,
                                             run.load)
    batches = run.val_batches
    operators = run.trainer.core.encoder.aggregation_spec(training=False)
    for i, step in enumerate(prefetch(_step_batches(run, batches, VAL_STEP_BASE, operators), run.training.device)):
        interval.add(run.trainer.evaluate(step, VAL_STEP_BASE + i))
    return interval.read("val", 0)


def _step_batches(run: _Run, batches: Iterable[Rows], first_step: int,
                  operators: OperatorSpec) -> Iterator[StepBatch]:
    """This worker's share of each global batch in ``batches`` (global steps ``first_step``, ``first_step + 1``,
    ...), with the encoder's neighbour-sum operators: built on the host, ahead of the step (prefetch)."""
    plan, rank, world = run.plan, run.training.rank, run.training.world
    for i, rows in enumerate(batches):
        data = PretrainData.of(rows.arrays, rows.ids)
        yield build_step_batch(data, np.arange(len(rows)), rank, world, plan.heads, plan.seed, first_step + i,
                               operators=operators)


LOGGED = ("loss", "av", "bv", "fg", "cmim", "recon", "recon_accuracy")  # the log line; metrics.csv has every term


def _log_line(progress: PretrainProgress, metrics: dict[str, float], lr: float) -> str:
    shown = [f"{name} {metrics[f'train_{name}']:.4f}" for name in LOGGED if f"train_{name}" in metrics]
    shown += [f"val_loss {metrics['val_loss']:.4f}"] if "val_loss" in metrics else []
    speed = f"  {metrics['molecules_per_s']:.0f} mol/s" if "molecules_per_s" in metrics else ""
    return (f"[pretrain] epoch {progress.epoch:3d} step {progress.global_step:6d}  " + "  ".join(shown)
            + f"  lr {lr:.3e}{speed}")


def _step_seed(seed: int, global_step: int, rank: int) -> int:
    """Torch's RNG per (seed, step, rank) (dropout_draws "torch"): a resumed run draws what the uninterrupted one
    drew."""
    return stream_seed(seed, Stream.PRETRAIN_TORCH, global_step, rank)


def _trainer(plan: PretrainPlan, training: TrainingState[PretrainProgress]) -> PretrainStep:
    distribution = Distribution()
    if training.world > 1:
        # its own group: the gather's backward never interleaves with DDP's gradient all-reduces
        distribution = Distribution(training.world, training.rank, all_gather_with_grad(dist.new_group()))
    settings = PretrainStepSettings(plan.seed, plan.loss, plan.per_rank_loss, plan.dropout_draws, plan.precision)
    return PretrainStep(training.model, training.optimizer, training.scheduler, settings, distribution)


def _after_step(run: _Run, epoch_end: bool, report: Report) -> bool:
    """Log, validate and checkpoint as the intervals say; returns whether the run stops here."""
    plan, progress = run.plan, run.training.progress
    step = progress.global_step
    stop = plan.stop_after_steps is not None and step >= plan.stop_after_steps
    metrics: dict[str, float] = {}
    if step % plan.train_interval == 0 or epoch_end or stop:
        metrics.update(run.interval.read("train", run.interval.steps * plan.global_batch_size))
    if plan.shards.n_val and ((plan.val_interval and step % plan.val_interval == 0) or epoch_end):
        metrics.update(_validate(run))
    if metrics:
        lr = run.trainer.scheduler.get_last_lr()[0]
        progress.history.append({"epoch": progress.epoch, "step": step, "lr": lr, **metrics})
        if run.training.rank == 0:
            print(_log_line(progress, metrics, lr), flush=True)
    if step % plan.save_interval == 0 or epoch_end or stop:
        report({"epoch": progress.epoch, "global_step": step, **metrics})
    if metrics:
        run.interval.started = time.perf_counter()  # molecules/s counts training time, not validation's
    return stop


Report = Callable[[dict[str, float]], None]  # every rank, at each save interval and epoch end: checkpoint now


def fit_pretrain(plan: PretrainPlan, load: Load, training: TrainingState[PretrainProgress],
                 report: Report) -> None:
    """Train from where ``training.progress`` stands to the plan's last epoch (or ``stop_after_steps``), logging
    and validating at the plan's intervals and calling ``report`` with the metrics at every save interval;
    ``load`` reads one shard of the corpus."""
    progress = training.progress
    if progress.global_step and training.rank == 0:
        print(f"[pretrain] resuming at step {progress.global_step} (epoch {progress.epoch}, batch "
              f"{progress.batch_idx})", flush=True)
    run = _Run(plan, load, training, _trainer(plan, training), _Interval(training.communicator.all_reduce))
    operators = training.core.encoder.aggregation_spec(training=True)
    if not plan.steps_per_epoch:
        raise ValueError("the pretraining plan has no training molecules")
    while progress.epoch < plan.epochs:
        batches = epoch_batches(plan.shards, progress.epoch, plan.global_batch_size, progress.batch_idx, load)
        remaining = _step_batches(run, batches, progress.global_step, operators)
        for step in prefetch(remaining, training.device):  # the next batches are built while this step computes
            if plan.stop_after_steps is not None and progress.global_step >= plan.stop_after_steps:
                return
            torch.manual_seed(_step_seed(plan.seed, progress.global_step, training.rank))
            run.interval.add(run.trainer.train(step, progress.global_step))
            progress.global_step += 1
            progress.batch_idx += 1
            epoch_end = progress.batch_idx == plan.steps_per_epoch
            if epoch_end:
                progress.epoch, progress.batch_idx = progress.epoch + 1, 0
            if _after_step(run, epoch_end, report):
                return


__all__ = ["PretrainPlan", "PretrainProgress", "Report", "build_pretrain", "fit_pretrain"]
