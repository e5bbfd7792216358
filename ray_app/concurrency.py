"""How many training runs (ensemble members, folds, Tune trials) may run at once without oversubscribing the cluster.

Each run is a TorchTrainer with ``num_workers`` workers (1 CPU each, plus 1 GPU each with ``use_gpu``). Neither
Tune nor our member pool sees the placement groups those trainers request (ray#54305), so the cap is computed here
from the resources that are free when the run starts, and a user value is honoured as given. On an autoscaling
cluster free resources understate what the cluster can grow to: pass ``--max_concurrent_trials`` there.
"""

from __future__ import annotations

import math
from typing import Mapping

import ray

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
    """The user's cap if given, else what the free cluster resources allow; never more than there are runs."""
    allowed = requested if requested is not None else capacity(ray.available_resources(), num_workers, use_gpu)
    return max(1, min(allowed, runs))
