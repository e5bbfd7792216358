"""ray_app.common.orphans on the session's cluster: the placement group that Ray leaves reserved when an actor of an
ended job asks for one is released; the groups of a live job and a detached group of an ended job are kept."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.state import list_placement_groups

from ray_app.common.orphans import release_orphaned_placement_groups
from ray_app.common.ray_internals import placement_group_by_hex

# A driver whose actor asks for a placement group the moment Ray has marked its job ended (as a Train controller
# restarting its worker group while a killed driver's workers die does); it also leaves a detached group.
DRIVER = """
import sys, threading, time
import ray
import ray._private.state as state
from ray.util.placement_group import placement_group

ray.init(address=sys.argv[1], logging_level="ERROR")
detached = placement_group([{"CPU": 0.01}], lifetime="detached")
ray.get(detached.ready())

@ray.remote(num_cpus=0)
class LateReserver:
    def start(self):
        job = ray.get_runtime_context().get_job_id()
        def reserve_once_the_job_ended():
            while not any(entry["JobID"] == job and entry["IsDead"] for entry in state.jobs()):
                time.sleep(0.001)
            placement_group([{"CPU": 0.01}])
        threading.Thread(target=reserve_once_the_job_ended, daemon=True).start()
        return job

reserver = LateReserver.remote()  # kept: an actor whose handle is dropped ends at once
print(ray.get(reserver.start.remote()), detached.id.hex(), flush=True)
time.sleep(600)
"""


def _groups(address: str) -> dict[str, tuple[str, bool]]:
    listed = list_placement_groups(address=address, detail=True, filters=[("state", "!=", "REMOVED")])
    return {g.placement_group_id: (g.creator_job_id, g.is_detached) for g in listed}


def _wait_for_group_of(address: str, job: str, detached: bool, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [pg for pg, owner in _groups(address).items() if owner == (job, detached)]
        if found:
            return found[0]
        time.sleep(0.2)
    pytest.fail(f"no {'detached ' if detached else ''}placement group of job {job} in {timeout} s")


def test_the_group_an_ended_jobs_actor_reserved_is_released_and_no_other(ray_cluster):
    address = ray.get_runtime_context().gcs_address
    live = placement_group([{"CPU": 0.01}])  # this test's own job is alive: its group stays
    ray.get(live.ready())
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, address], stdout=subprocess.PIPE, text=True)
    job, detached = driver.stdout.readline().split()
    driver.kill()  # as a driver dies: no goodbye, Ray ends its job and kills its actor
    driver.wait()
    orphan = _wait_for_group_of(address, job, detached=False)
    time.sleep(2)  # Ray has long killed the actor; the group is still there (the reason orphans.py exists)
    assert orphan in _groups(address), "Ray now removes this group itself: ray_app/common/orphans.py can go"
    try:
        released = release_orphaned_placement_groups()
        assert orphan in [line.split()[0] for line in released]
        left = _groups(address)
        assert orphan not in left and live.id.hex() in left and detached in left
    finally:
        remove_placement_group(live)
        remove_placement_group(placement_group_by_hex(detached))
