"""Helpers every Ray Train worker loop shares (finetune, pretrain): collectives that are the identity on one
worker, the one placement line per (re)start, and Ray Train's per-report log noise turned off."""

from __future__ import annotations

import logging
from typing import Any

import ray
import ray.train
import torch
import torch.distributed as dist

from ray_app.common.ray_internals import train_report_logger


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


__all__ = ["all_gather", "all_reduce", "print_placement", "quiet_report_logs"]
