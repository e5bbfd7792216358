"""The skeleton every Ray Train worker loop shares (finetune's member loop, pretraining's step loop); each loop
supplies how its model is built and loaded, its step, and what else its checkpoint holds.

- :func:`start`: Ray Train's per-report log noise off; the model, optimizer, scheduler and progress restored from
  the run's last reported checkpoint (a restarted group, or the same command re-run after the driver died), or
  fresh; the model wrapped for data parallelism; the one placement line of each (re)start. It returns the worker's
  typed state, a :class:`Training`.
- :meth:`Training.report`: every rank reports the epoch's or interval's metrics (Ray Train's report is a
  collective); rank 0, which owns side effects, attaches the checkpoint: :data:`STATE_FILE` (optimizer, scheduler,
  progress and what the loop adds) and the files the loop writes beside it.
- :func:`optimizer_and_scheduler`: Adam and upstream's Noam schedule from a plan's schedule settings.
- :func:`all_reduce` / :func:`all_gather`: collectives that are the identity on one worker.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from kermt.run_layout import CHECKPOINT_STATE_FILE
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer
from ray_app.common.ray_internals import train_report_logger

STATE_FILE = CHECKPOINT_STATE_FILE  # in every checkpoint: optimizer, scheduler, progress (+ what the loop adds)


@dataclass
class LoopProgress:
    """Where a run stands, saved in every checkpoint: epochs and optimizer steps done, the logged metric rows. A
    loop subclasses it with what else it resumes from."""

    epoch: int = 0
    global_step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


P = TypeVar("P", bound=LoopProgress)


class SchedulePlan(Protocol):
    """The schedule settings a plan carries, by their flag names (``DataParallelSettings``)."""

    epochs: int
    warmup_epochs: float
    init_lr: float
    max_lr: float
    final_lr: float
    weight_decay: float


def optimizer_and_scheduler(model: torch.nn.Module, plan: SchedulePlan, steps_per_epoch: int,
                            fine_tune_coff: float = 1.0) -> tuple[torch.optim.Optimizer, NoamLR]:
    """Adam and upstream's Noam schedule over ``steps_per_epoch`` global steps an epoch. Built once the model is on
    its device, so restored Adam state lands next to its parameters."""
    optimizer = build_optimizer(model, plan.init_lr, plan.weight_decay, fine_tune_coff)
    schedule = NoamSchedule(plan.warmup_epochs, plan.epochs, steps_per_epoch, plan.init_lr, plan.max_lr,
                            plan.final_lr)
    return optimizer, NoamLR(optimizer, schedule, fine_tune_coff)


@dataclass
class Training(Generic[P]):
    """One worker's training: its model (DDP-wrapped on more than one worker), optimizer, scheduler and progress,
    and its place in the group."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: NoamLR
    progress: P
    rank: int
    world: int
    device: torch.device

    @property
    def core(self) -> torch.nn.Module:
        """The model without its DDP wrapper: what a checkpoint saves."""
        return getattr(self.model, "module", self.model)

    def report(self, metrics: dict[str, Any], saved: Callable[[Path], dict[str, Any]]) -> None:
        """Every rank reports ``metrics``; rank 0 attaches a checkpoint: ``saved(directory)`` writes the loop's own
        files there and returns what :data:`STATE_FILE` holds beside the optimizer, scheduler and progress."""
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if self.rank == 0:
                state = {**saved(Path(directory)), "optimizer": self.optimizer.state_dict(),
                         "scheduler": self.scheduler.state_dict(), "progress": asdict(self.progress)}
                torch.save(state, Path(directory) / STATE_FILE)
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=checkpoint)


Build = Callable[[torch.device], tuple[torch.nn.Module, torch.optim.Optimizer, NoamLR]]
LoadWeights = Callable[[torch.nn.Module, Path, dict[str, Any]], None]


def start(label: str, build: Build, progress_type: type[P], load_weights: LoadWeights) -> Training[P]:
    """This worker's training, restored from the run's last checkpoint if there is one. ``build(device)``: the
    loop's model on ``device`` with its optimizer and scheduler; ``load_weights(model, directory, state)`` loads a
    checkpoint's weights (from its directory or its :data:`STATE_FILE`); ``label`` names the run in log lines."""
    quiet_report_logs()
    context, device = ray.train.get_context(), ray.train.torch.get_device()
    model, optimizer, scheduler = build(device)
    progress = progress_type()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / STATE_FILE, weights_only=True, map_location=device)
            load_weights(model, Path(directory), state)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        progress = progress_type(**state["progress"])
    training = Training(ray.train.torch.prepare_model(model), optimizer, scheduler, progress,
                        context.get_world_rank(), context.get_world_size(), device)
    print_placement(label, progress.epoch, training.rank)
    return training


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
    return tensor


def all_gather(obj: Any, world_size: int) -> list[Any]:
    if world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def quiet_report_logs() -> None:
    """Ray Train logs every report() at INFO on a logger that LoggingConfig does not reach
    (``ray_internals.TRAIN_REPORT_MODULE``); our loop prints one line per epoch instead."""
    logger = train_report_logger()
    if logger is not None:  # None: a later Ray moved it; only log noise is at stake
        logger.setLevel(logging.WARNING)


def print_placement(label: str, epoch: int, rank: int) -> None:
    """One line per (re)start: where the workers run, e.g. "2 worker(s) on 2 node(s) (127.0.0.3, 127.0.0.4)"."""
    world = ray.train.get_context().get_world_size()
    nodes = all_gather(ray.util.get_node_ip_address(), world)
    if rank == 0:
        where = ", ".join(dict.fromkeys(nodes))
        print(f"[{label}] {'resuming at' if epoch else 'starting'} epoch {epoch}: {world} worker(s) on "
              f"{len(set(nodes))} node(s) ({where})", flush=True)


__all__ = ["LoopProgress", "STATE_FILE", "SchedulePlan", "Training", "all_gather", "all_reduce",
           "optimizer_and_scheduler", "print_placement", "quiet_report_logs", "start"]
