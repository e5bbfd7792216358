"""Connecting to Ray: a cluster address (flag or RAY_ADDRESS) or, with none, a local cluster started here.

The same command therefore runs on a laptop, in CI and on a cluster (where ``ray job submit`` sets RAY_ADDRESS).

A cluster started here is addressed explicitly by every process it runs. Ray's state API (``ray.util.state``, which
Ray Train's PlacementGroupCleaner and state actor and Ray Data's hang detector call with no address) finds "its"
cluster from RAY_ADDRESS, else from the GCS processes running on the machine (``ray_internals`` says where): with a
second Ray instance on the machine (a user's ``ray start``, a notebook, another sweep) it raises "Found multiple
active Ray instances" or, after a ``ray start``, silently talks to that other cluster. The cleaner then never
frees the placement group of a trial that Tune stopped, and the next trial waits for it forever. So the local
cluster's GCS port is chosen before it starts and RAY_ADDRESS names it in the environment the raylet (and so every
worker it spawns) inherits. The driver's own environment is restored (only Ray Data's hang detector asks the state
API from there, and it only logs), so a process the driver starts later still starts a cluster of its own.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ray

from ray_app.common.orphans import release_orphans_now_and_at_exit
from ray_app.common.ray_internals import (AUTH_TOKEN_SETUP_LOGGER, DATA_PROGRESS_LOGGER, GCS_PORT_VARIABLE,
                                          HEAD_NODE_RESOURCE, TRAIN_PREEMPTION_WATCHER_VARIABLE,
                                          TRAIN_PRINT_PATCH_VARIABLE, TUNE_NEW_OUTPUT_VARIABLE)

# Quiet, local-friendly defaults; a user's own environment always wins (setdefault).
_LOCAL_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    TRAIN_PRINT_PATCH_VARIABLE: "0",  # otherwise every worker print appears twice in the driver output
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "300",  # loaded CI machines can exceed the 60 s default
    TUNE_NEW_OUTPUT_VARIABLE: "0",  # no experiment table at the start of every Tuner.fit (ray_internals says why)
}
# Only for a cluster started here: one machine has no spot preemption to watch for. On a real cluster the watcher
# stays on, so Ray Train counts a preempted node apart from --max_failures (FailureConfig.max_preemption_failures).
_LOCAL_ONLY_ENV = {TRAIN_PREEMPTION_WATCHER_VARIABLE: "0"}
# The GCS addresses of the local clusters connect() started in this process: such a session runs this process's
# own work (a finetune's trainers), it is not a cluster someone else runs (ray_app.screening.engines asks)
_STARTED_HERE: set[str] = set()


def connect(address: str | None = None, num_cpus: int | None = None, object_store_mb: int | None = None,
            local_env: Callable[[], Mapping[str, str]] | None = None) -> dict:
    """ray.init once; returns the cluster's total resources. Reuses an already initialised session. ``local_env``:
    more environment for a cluster started here (a running cluster keeps the environment its nodes started with;
    a user's own variables win)."""
    for key, value in _LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        kwargs: dict[str, Any] = {"log_to_driver": True, "configure_logging": True, "logging_level": "WARNING"}
        if address:
            ray.init(address=address, **kwargs)
            release_orphans_now_and_at_exit()  # what a killed driver left reserved there (orphans.py says why)
        else:
            # "local": always a new cluster here. A bare ray.init() would attach to any cluster that `ray start`
            # left running on this machine; `--address auto` asks for that explicitly.
            for key, value in {**_LOCAL_ONLY_ENV, **(local_env() if local_env else {})}.items():
                os.environ.setdefault(key, value)
            if num_cpus is not None:
                kwargs["num_cpus"] = num_cpus
            if object_store_mb is not None:
                kwargs["object_store_memory"] = object_store_mb * 2**20
            _start_local_cluster(kwargs)
    _quiet_ray_data()
    return ray.cluster_resources()


def _start_local_cluster(kwargs: dict[str, Any]) -> None:
    """ray.init(address="local") with the GCS on a port chosen here and RAY_ADDRESS naming it in the environment the
    cluster's processes start with; the driver's environment is left as it was."""
    port = os.environ.get(GCS_PORT_VARIABLE) or str(free_port())
    cluster_env = {"RAY_ADDRESS": f"{ray.util.get_node_ip_address()}:{port}", GCS_PORT_VARIABLE: port}
    saved = {key: os.environ.get(key) for key in cluster_env}
    os.environ.update(cluster_env)  # the GCS and the raylet copy it; every worker the raylet spawns inherits it
    # Ray turns token authentication on for a cluster that ray.init starts (the secure default we want) and warns
    # that it did, at every start; the warning asks nothing of our users.
    token_setup = logging.getLogger(AUTH_TOKEN_SETUP_LOGGER)
    level = token_setup.level
    token_setup.setLevel(logging.ERROR)
    try:
        ray.init(address="local", **kwargs)
        _STARTED_HERE.add(ray.get_runtime_context().gcs_address)
    finally:
        token_setup.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def started_here() -> bool:
    """Whether this process's Ray session is a local cluster that :func:`connect` started here (False: none, or a
    cluster it joined)."""
    return ray.is_initialized() and ray.get_runtime_context().gcs_address in _STARTED_HERE


def count_as_joined() -> None:
    """Treat this process's Ray session as a cluster it joined (tests: the session's one local cluster stands for
    a user's running cluster, on which ``--engine auto`` streams)."""
    if ray.is_initialized():
        _STARTED_HERE.discard(ray.get_runtime_context().gcs_address)


def free_port() -> int:
    # Another process may take the port before the GCS binds it; ray.init then fails loudly, never silently.
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _quiet_ray_data() -> None:
    from ray.data import DataContext

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # per-dataset execution plans are noise for users
    logging.getLogger(DATA_PROGRESS_LOGGER).setLevel(logging.ERROR)  # "Progress bars disabled": we chose that
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
        head = [n for n in nodes if HEAD_NODE_RESOURCE in n.get("Resources", {})]
        head_cpus = head[0]["Resources"].get("CPU", 0.0) if head else 0.0
        return ClusterLayout(len(nodes), head_cpus)

    @property
    def multi_node(self) -> bool:
        # A head without CPUs runs no trainer or task itself: every worker sits on another machine, even while
        # the autoscaler has not started it yet.
        return self.alive_nodes > 1 or self.head_cpus == 0
