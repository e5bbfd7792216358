"""A rank's training state, and what a checkpoint of it holds, for every runner of the loops in
:mod:`kermt.train.loop` (and pretraining's step loop in ``ray_app/pretrain``).

- :class:`LoopProgress`: where a run stands (epochs and optimizer steps done, the logged metric rows); a loop
  subclasses it with what else it resumes from.
- :class:`TrainingState`: the model (wrapped for data parallelism on more than one rank), optimizer, scheduler,
  progress, the rank's :class:`~kermt.train.communicator.Communicator` and device.
- :func:`checkpoint_state` / :func:`restore`: the state dict a checkpoint saves (optimizer, scheduler, progress
  and what the loop adds: its weights) and the way back from it. Ray Train's workers keep it in a Ray checkpoint;
  a notebook can ``torch.save`` it. A run restored from it continues with the draws the uninterrupted run made.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

import torch

from kermt.train.communicator import Communicator
from kermt.train.optim import NoamLR


@dataclass
class LoopProgress:
    """Where a run stands, saved in every checkpoint: epochs and optimizer steps done, the logged metric rows. A
    loop subclasses it with what else it resumes from."""

    epoch: int = 0
    global_step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


P = TypeVar("P", bound=LoopProgress)


@dataclass
class TrainingState(Generic[P]):
    """One rank's training: its model (DDP-wrapped on more than one rank), optimizer, scheduler and progress, and
    its place in the group."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: NoamLR
    progress: P
    communicator: Communicator
    device: torch.device

    @property
    def core(self) -> torch.nn.Module:
        """The model without its DDP wrapper: what a checkpoint saves."""
        return getattr(self.model, "module", self.model)

    @property
    def rank(self) -> int:
        return self.communicator.rank

    @property
    def world(self) -> int:
        return self.communicator.world_size


def checkpoint_state(training: TrainingState[Any], extra: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint saves: ``extra`` (the loop's weights) with the optimizer, scheduler and progress."""
    return {**extra, "optimizer": training.optimizer.state_dict(), "scheduler": training.scheduler.state_dict(),
            "progress": asdict(training.progress)}


def restore(optimizer: torch.optim.Optimizer, scheduler: NoamLR, state: dict[str, Any],
            progress_type: type[P]) -> P:
    """Load a :func:`checkpoint_state`'s optimizer and scheduler (the loop loads its weights itself: they may live
    beside it); returns its progress."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return progress_type(**state["progress"])


__all__ = ["LoopProgress", "TrainingState", "checkpoint_state", "restore"]
