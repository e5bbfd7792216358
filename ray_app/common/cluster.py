"""Connecting to Ray: a cluster address (flag or RAY_ADDRESS) or, with none, a local cluster started here.

The same command therefore runs on a laptop, in CI and on a cluster (where ``ray job submit`` sets RAY_ADDRESS).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray

# Quiet, local-friendly defaults; a user's own environment always wins (setdefault).
_LOCAL_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # otherwise every worker print appears twice in the driver output
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "300",  # loaded CI machines can exceed the 60 s default
}
# Only for a cluster started here: one machine has no spot preemption to watch for. On a real cluster the watcher
# stays on, so Ray Train counts a preempted node apart from --max_failures (FailureConfig.max_preemption_failures).
_LOCAL_ONLY_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def connect(address: str | None = None, num_cpus: int | None = None, object_store_mb: int | None = None) -> dict:
    """ray.init once; returns the cluster's total resources. Reuses an already initialised session."""
    for key, value in _LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        kwargs: dict[str, Any] = {"log_to_driver": True, "configure_logging": True, "logging_level": "WARNING"}
        if address:
            kwargs["address"] = address
        else:
            # "local": always a new cluster here. A bare ray.init() would attach to any cluster that `ray start`
            # left running on this machine; `--address auto` asks for that explicitly.
            kwargs["address"] = "local"
            for key, value in _LOCAL_ONLY_ENV.items():
                os.environ.setdefault(key, value)
            if num_cpus is not None:
                kwargs["num_cpus"] = num_cpus
            if object_store_mb is not None:
                kwargs["object_store_memory"] = object_store_mb * 2**20
        ray.init(**kwargs)
    _quiet_ray_data()
    return ray.cluster_resources()


def _quiet_ray_data() -> None:
    from ray.data import DataContext

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # per-dataset execution plans are noise for users
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True  # results come back in input order


@dataclass(frozen=True)
class ClusterLayout:
    """What decides whether node-local paths are safe: how many nodes there are (or may be) and where work runs."""

    alive_nodes: int
    head_cpus: float

    @staticmethod
    def current() -> "ClusterLayout":
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        head = [n for n in nodes if "node:__internal_head__" in n.get("Resources", {})]
        head_cpus = head[0]["Resources"].get("CPU", 0.0) if head else 0.0
        return ClusterLayout(len(nodes), head_cpus)

    @property
    def multi_node(self) -> bool:
        # A head without CPUs runs no trainer or task itself: every worker sits on another machine, even while
        # the autoscaler has not started it yet.
        return self.alive_nodes > 1 or self.head_cpus == 0
