"""Placement groups that a dead driver's run left reserved on a running cluster, and their release.

A placement group belongs to the job (driver) that made it: Ray removes it when that job ends, unless it was made
detached. Ray 2.60 misses one case: a group that an actor of the job asks for after Ray has marked the job ended
(tests/ray_app/common/test_orphans.py makes one). When a finetune's driver dies (SIGKILL, an OOM kill, a lost head
session), a Train controller that is still running while Ray kills the job's actors can be that actor: its workers
die, it restarts its worker group and reserves a new group. Its CPUs or GPUs then stay reserved until the cluster
stops: on an autoscaling cluster a GPU node that never scales in, on a fixed one a run that waits for them forever
(tests/multinode's rerun test left one in CI, and in 1 of 5 runs here).

So every command that joins a running cluster releases such groups when it connects and when it exits: groups that
are not detached and whose job has ended. Nothing alive can use one (a job's actors end with it), so releasing it
takes nothing from anyone. A cluster started by this process has none: its groups end with it.
"""

from __future__ import annotations

import atexit
import logging

import ray

from ray_app.common.ray_internals import placement_group_by_hex

logger = logging.getLogger(__name__)

_LISTED = 10_000  # jobs or groups asked of the state API (its default is 100)
_STATE_API_TIMEOUT_S = 10  # a command waits at most this long for each answer (the default is 30 s)


def release_orphaned_placement_groups() -> list[str]:
    """Remove the placement groups of ended jobs that are still reserved; returns what it removed (one line each).
    Never fails a run: without the state API (a cluster started without its dashboard) it releases nothing."""
    from ray.util.state import list_jobs, list_placement_groups

    address = ray.get_runtime_context().gcs_address
    try:  # a job missing from a truncated answer is not counted as ended: its groups stay
        groups = list_placement_groups(address=address, detail=True, filters=[("state", "!=", "REMOVED")],
                                       limit=_LISTED, timeout=_STATE_API_TIMEOUT_S)
        jobs = list_jobs(address=address, limit=_LISTED, timeout=_STATE_API_TIMEOUT_S) if groups else []
    except Exception as error:  # the state API is a dashboard service: a cluster may run without it
        logger.debug("placement groups of ended runs not checked: %s", error)
        return []
    # a job id may be listed twice (a submission and its driver): ended only if no entry of it is live
    live = {job.job_id for job in jobs if job.job_id and not job.status.is_terminal()}
    ended = {job.job_id for job in jobs if job.job_id} - live
    released = []
    for group in groups:
        if group.is_detached or group.creator_job_id not in ended:
            continue
        ray.util.remove_placement_group(placement_group_by_hex(group.placement_group_id))
        released.append(f"{group.placement_group_id} of job {group.creator_job_id} ({group.state})")
    if released:
        print(f"released {len(released)} placement group(s) that runs whose driver died had left reserved: "
              + ", ".join(released), flush=True)
    return released


def release_orphans_now_and_at_exit() -> None:
    """On a cluster this process joined: release the orphans now and once more when the process exits (a driver
    killed just before this one started may leave its group only after this one connected)."""
    release_orphaned_placement_groups()
    atexit.register(_release_if_connected)


def _release_if_connected() -> None:
    if ray.is_initialized():
        release_orphaned_placement_groups()
