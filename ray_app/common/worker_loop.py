"""The Ray side of every Ray Train worker loop (finetune's member loop in ``kermt.train.loop``, pretraining's step
loop): what the loops ask of their runner, answered with Ray Train.

- :func:`start`: Ray Train's per-report log noise off; the worker's place in the group as a
  :class:`~kermt.train.communicator.TorchDistributed` communicator; the model, optimizer, scheduler and progress
  restored from the run's last reported checkpoint (a restarted group, or the same command re-run after the driver
  died), or fresh; the model wrapped for data parallelism (``prepare_model``); the one placement line of each
  (re)start. It returns the worker's typed state, a :class:`Training`.
- :meth:`Training.report`: every rank reports the epoch's or interval's metrics (Ray Train's report is a
  collective); rank 0, which owns side effects, attaches the checkpoint: :data:`STATE_FILE`
  (``kermt.train.state.checkpoint_state``: optimizer, scheduler, progress and what the loop adds) and the files the
  loop writes beside it.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch

from kermt.run_layout import CHECKPOINT_STATE_FILE
from kermt.train.communicator import Communicator, TorchDistributed
from kermt.train.optim import NoamLR
from kermt.train.state import P, TrainingState, checkpoint_state, restore
from ray_app.common.ray_internals import train_report_logger

STATE_FILE = CHECKPOINT_STATE_FILE  # in every checkpoint: optimizer, scheduler, progress (+ what the loop adds)


@dataclass
class Training(TrainingState[P]):
    """One Ray Train worker's training state, which reports to Ray Train."""

    def report(self, metrics: dict[str, Any], saved: Callable[[Path], dict[str, Any]]) -> None:
        """Every rank reports ``metrics``; rank 0 attaches a checkpoint: ``saved(directory)`` writes the loop's own
        files there and returns what :data:`STATE_FILE` holds beside the optimizer, scheduler and progress."""
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if self.rank == 0:
                torch.save(checkpoint_state(self, saved(Path(directory))), Path(directory) / STATE_FILE)
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=checkpoint)


Build = Callable[[torch.device, int], tuple[torch.nn.Module, torch.optim.Optimizer, NoamLR]]
LoadWeights = Callable[[torch.nn.Module, Path, dict[str, Any]], None]


def start(label: str, build: Build, progress_type: type[P], load_weights: LoadWeights) -> Training[P]:
    """This worker's training, restored from the run's last checkpoint if there is one. ``build(device, rank)``:
    the loop's model on ``device`` with its optimizer and scheduler (fresh weights only when
    :func:`ray.train.get_checkpoint` has none); ``load_weights(model, directory, state)`` loads a checkpoint's
    weights (from its directory or its :data:`STATE_FILE`); ``label`` names the run in log lines."""
    quiet_report_logs()
    context, device = ray.train.get_context(), ray.train.torch.get_device()
    communicator = TorchDistributed(context.get_world_rank(), context.get_world_size())
    model, optimizer, scheduler = build(device, communicator.rank)
    progress = progress_type()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / STATE_FILE, weights_only=True, map_location=device)
            load_weights(model, Path(directory), state)
        progress = restore(optimizer, scheduler, state, progress_type)
    training = Training(ray.train.torch.prepare_model(model), optimizer, scheduler, progress, communicator, device)
    print_placement(label, progress.epoch, communicator)
    return training


def quiet_report_logs() -> None:
    """Ray Train logs every report() at INFO on a logger that LoggingConfig does not reach
    (``ray_internals.TRAIN_REPORT_MODULE``); our loop prints one line per epoch instead."""
    logger = train_report_logger()
    if logger is not None:  # None: a later Ray moved it; only log noise is at stake
        logger.setLevel(logging.WARNING)


def print_placement(label: str, epoch: int, communicator: Communicator) -> None:
    """One line per (re)start: where the workers run, e.g. "2 worker(s) on 2 node(s) (127.0.0.3, 127.0.0.4)"."""
    nodes = communicator.all_gather(ray.util.get_node_ip_address())
    if communicator.rank == 0:
        where = ", ".join(dict.fromkeys(nodes))
        print(f"[{label}] {'resuming at' if epoch else 'starting'} epoch {epoch}: {communicator.world_size} "
              f"worker(s) on {len(set(nodes))} node(s) ({where})", flush=True)


__all__ = ["STATE_FILE", "Training", "print_placement", "quiet_report_logs", "start"]
