"""``train_loop_per_worker`` of `kermt pretrain`: Ray Train runs it on every worker of the group.

The loop itself (the epochs' global batches, logging, validation, and what makes N workers equal one process) is
:func:`kermt.pretrain.loop.fit_pretrain`; this adapter gives it what Ray Train provides: the plan from the object
store, how this worker reads a corpus shard (``ray_app.pretrain.shard_reads``: the worker reads the shards of its
batches as it reaches them, never the whole corpus), the worker's place in the group and the model restored from the
run's last checkpoint (``ray_app.common.worker_loop.start``), and as its ``report`` hook a Ray Train checkpoint
(native weights, optimizer, scheduler, progress = epoch, batch index and global step) from rank 0. A restarted
group, a re-run of the same command after the driver died, or a group of another size (elastic) continues at the
next batch of the plan with the same draws, so it ends with the weights of an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kermt.checkpoint import load_native
from kermt.pretrain.export import save_pretrain_native
from kermt.pretrain.loop import PretrainPlan, PretrainProgress, build_pretrain, fit_pretrain
from ray_app.common.worker_loop import start
from ray_app.pretrain.shard_reads import CorpusShards

MODEL_DIR = "model"  # the checkpoint's weights, in the native format (a step checkpoint is a model directory)


def _load_weights(model: torch.nn.Module, directory: Path, state: dict[str, Any]) -> None:
    model.load_state_dict(load_native(directory / MODEL_DIR).state_dict)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    plan: PretrainPlan = config["plan"]
    shards: CorpusShards = config["corpus"]
    training = start("pretrain", lambda device, rank: build_pretrain(plan, device), PretrainProgress, _load_weights)

    def save_model(directory: Path) -> dict[str, Any]:
        """A checkpoint's weights: a native model directory (STATE_FILE holds nothing more)."""
        save_pretrain_native(directory / MODEL_DIR, training.core, plan.loss)
        return {}

    fit_pretrain(plan, shards.loader(), training, lambda metrics: training.report(metrics, save_model))


__all__ = ["MODEL_DIR", "PretrainPlan", "PretrainProgress", "train_loop_per_worker"]
