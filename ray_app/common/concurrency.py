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

A run whose workers the cluster can never hold (``check_workers_fit``) would wait forever: on one machine that is an
error before any work; on a multi-node cluster the autoscaler may still add nodes, so the driver says what the run
waits for, and says it again every ``WAIT_NOTICE_S`` seconds until the cluster is large enough.
"""

from __future__ import annotations

import math
import threading
from typing import Mapping

from kermt.errors import UserError

# Memory one CPU training worker of the release model needs (weights, gradients, Adam state, activations of a
# 32-molecule batch), rounded up; used only to avoid starting more runs than the free memory can hold.
WORKER_MEMORY_BYTES = 3 * 2**30
WAIT_NOTICE_S = 30.0  # how often the driver repeats what a run waits for on a cluster too small for it yet


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
    import ray  # here, not above: a dry run reads worker_demand without Ray

    from ray_app.common.cluster import ClusterLayout

    if requested is not None:
        allowed = requested
    elif ClusterLayout.current().multi_node:
        allowed = runs
    else:
        allowed = capacity(ray.available_resources(), num_workers, use_gpu)
    return max(1, min(allowed, runs))


def worker_demand(num_workers: int, use_gpu: bool) -> dict[str, float]:
    """What a run's worker group asks Ray for, all at once: 1 CPU per worker (Ray Train's default), +1 GPU each."""
    return {"CPU": float(num_workers), **({"GPU": float(num_workers)} if use_gpu else {})}


def shortfall(demand: Mapping[str, float], total: Mapping[str, float]) -> dict[str, float]:
    """The resources of ``demand`` that ``total`` does not hold, with what ``total`` has of each."""
    return {key: total.get(key, 0.0) for key, needed in demand.items() if total.get(key, 0.0) < needed}


def check_workers_fit(num_workers: int, use_gpu: bool, flag: str = "--num_workers") -> threading.Thread | None:
    """A run of ``num_workers`` workers (MIN of a range) on a cluster that cannot hold them: a UserError on one
    machine; on a multi-node cluster a line now and every ``WAIT_NOTICE_S`` while the cluster stays too small (the
    returned thread prints them)."""
    import ray

    from ray_app.common.cluster import ClusterLayout

    demand = worker_demand(num_workers, use_gpu)
    missing = shortfall(demand, ray.cluster_resources())
    if not missing:
        return None
    if ClusterLayout.current().multi_node:
        print(waiting_line(demand, missing), flush=True)
        return repeat_waiting_line(demand, WAIT_NOTICE_S)  # read now, not at import: a script may shorten it
    fits = int(min(math.floor(have) for have in missing.values()))
    message = (f"{flag} {num_workers}: a run starts its {num_workers} worker(s) at once and needs "
               f"{_resources(demand)}, but this one-machine Ray cluster has {_resources(missing)} and nothing will "
               f"add more, so it would wait forever. "
               + (f"Give {flag} {fits} or less, " if fits else "Give ") + "or attach to a larger cluster (--address)")
    raise UserError(message)


def waiting_line(demand: Mapping[str, float], missing: Mapping[str, float]) -> str:
    return (f"waiting for the cluster to grow: a run needs {_resources(demand)} for its workers, the cluster has "
            f"{_resources(missing)} (the autoscaler adds nodes for pending runs)")


def repeat_waiting_line(demand: Mapping[str, float], interval_s: float = WAIT_NOTICE_S,
                        stop: threading.Event | None = None) -> threading.Thread:
    """A daemon thread that prints ``waiting_line`` every ``interval_s`` while the cluster cannot hold ``demand``,
    and one line when it can; it ends then, when Ray shuts down, or when ``stop`` is set."""
    import ray

    stop = stop or threading.Event()

    def repeat() -> None:
        while not stop.wait(interval_s) and ray.is_initialized():
            try:
                missing = shortfall(demand, ray.cluster_resources())
            except Exception:  # Ray shut down meanwhile: nobody waits any more
                return
            if not missing:
                print(f"the cluster now holds a run's workers ({_resources(demand)})", flush=True)
                return
            print(waiting_line(demand, missing), flush=True)

    thread = threading.Thread(target=repeat, name="kermt-waiting-for-workers", daemon=True)
    thread.start()
    return thread


def _resources(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{value:g} {key}" for key, value in resources.items())
