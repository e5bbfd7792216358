"""How many training runs (ensemble members and folds, Tune trials: the trials of a Ray Tune run) run at once.

Each run is a TorchTrainer with ``num_workers`` workers (1 CPU each, plus 1 GPU each with ``use_gpu``). A user value
(``--max_concurrent_trials``) is honoured as given. Otherwise:
- on one machine, the cap is what the free resources hold when the run starts (Tune does not see the placement
  groups those trainers request, ray#54305, so more would only oversubscribe the machine);
- on a multi-node cluster (``cluster.ClusterLayout``), every run is started at once. Free resources there
  understate what an autoscaling cluster can grow to, and the runs that do not fit yet are exactly the pending
  demand the autoscaler scales on. A run whose workers cannot be placed waits: Ray Train retries a worker group
  that timed out waiting for resources without limit (a controller error, ``controller_failure_limit=-1``), and
  it does not count against ``--max_failures``.
"""

from __future__ import annotations

import math
from typing import Mapping

import ray

from ray_app.common.cluster import ClusterLayout

# Memory one CPU training worker of the release model needs (weights, gradients, Adam state, activations of a
# 32-molecule batch), rounded up; used only to avoid starting more runs than the free memory can hold.
WORKER_MEMORY_BYTES = 3 * 2**30


def capacity(free: Mapping[str, float], num_workers: int, use_gpu: bool) -> int:
    """Runs of ``num_workers`` workers that fit into ``free`` resources (at least 1: one run always starts)."""
    fits = [math.floor(free.get("CPU", 0.0) / num_workers)]
    if use_gpu:
        fits.append(math.floor(free.get("GPU", 0.0) / num_workers))
    if "memory" in free:
        fits.append(math.floor(free["memory"] / (num_workers * WORKER_MEMORY_BYTES)))
    return max(1, min(fits))


def concurrent_runs(requested: int | None, num_workers: int, use_gpu: bool, runs: int) -> int:
    """The user's cap if given, else every run on a multi-node cluster and what the free resources allow on one
    machine; never more than there are runs."""
    if requested is not None:
        allowed = requested
    elif ClusterLayout.current().multi_node:
        allowed = runs
    else:
        allowed = capacity(ray.available_resources(), num_workers, use_gpu)
    return max(1, min(allowed, runs))
