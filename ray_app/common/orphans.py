"""Placement groups that a dead driver's run left reserved on a running cluster, and their release.

A placement group that is not detached lives as long as the job (driver) that made it and, when an actor made it,
that actor: the GCS removes it once both are dead (a detached actor's group counts its job dead from birth). Ray
2.60 misses one case: a group that an actor of the job asks for after the GCS has processed the job's end is never
marked with either's death, so it outlives both (tests/ray_app/common/test_orphans.py makes one). When a finetune's
driver dies (SIGKILL, an OOM kill, a lost head session), a Train controller that is still running while Ray kills
the job's actors can be that actor: its workers die, it restarts its worker group and reserves a new group. Its
CPUs or GPUs then stay reserved until the cluster stops: on an autoscaling cluster a GPU node that never scales in,
on a fixed one a run that waits for them forever (tests/multinode's rerun test left one in CI, and in 1 of 5 runs
here).

So every command that joins a running cluster releases such groups when it connects and when it exits: groups that
are not detached, whose job has ended and whose creator actor (if an actor made it) is dead, by the GCS's own
tables. That is Ray's own rule, read from the job and actor tables instead of the group's flags: nothing alive can
use such a group, and a live actor's group (a detached actor's, of an ended job) stays. A cluster started by this
process has none: its groups end with it.
"""

from __future__ import annotations

import atexit
import logging

import ray

from ray_app.common.ray_internals import actor_ended, ended_job_ids, placement_group_by_hex, placement_group_records

logger = logging.getLogger(__name__)


def release_orphaned_placement_groups() -> list[str]:
    """Remove the placement groups whose job has ended and whose creator actor, if any, is dead; returns what it
    removed (one line each). Never fails a run: a Ray whose tables read differently (the test of ray_internals
    names it) releases nothing."""
    try:  # the job table is read only when a group could be an orphan (every command reads this at connect and exit)
        candidates = [group for group in placement_group_records() if group.state != "REMOVED" and not group.detached]
        ended = ended_job_ids() if candidates else set()
        orphans = [group for group in candidates if group.creator_job_id in ended
                   and (group.creator_actor_id is None or actor_ended(group.creator_actor_id))]
    except Exception as error:
        logger.warning("placement groups of ended runs not checked: %s", error)
        return []
    released = []
    for group in orphans:
        ray.util.remove_placement_group(placement_group_by_hex(group.group_id))
        released.append(f"{group.group_id} of job {group.creator_job_id} ({group.state})")
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
