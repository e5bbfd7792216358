"""ray_app.common.orphans on the session's cluster: the placement group that Ray leaves reserved when an actor of an
ended job asks for one is released; the groups of a live job, the group of an ended job's live detached actor and a
detached group of an ended job are kept."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from ray_app.common.orphans import release_orphaned_placement_groups
from ray_app.common.ray_internals import actor_ended, placement_group_by_hex, placement_group_records

# A driver whose actors ask for a placement group the moment the GCS has marked their job ended: two ordinary actors
# (as a Train controller restarting its worker group while a killed driver's workers die does), which race Ray
# killing them, and a detached one, which lives on. It also leaves a detached group.
DRIVER = """
import sys, threading, time
import ray
import ray._private.state as state
from ray.util.placement_group import placement_group

ray.init(address=sys.argv[1], logging_level="ERROR", namespace="orphans-test")
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
        return job, ray.get_runtime_context().get_actor_id()

racers = [LateReserver.remote() for _ in range(2)]  # kept: an actor whose handle is dropped ends at once
keeper = LateReserver.options(name="keeper-" + ray.get_runtime_context().get_job_id(), lifetime="detached").remote()
started = ray.get([actor.start.remote() for actor in [*racers, keeper]])
print(started[0][0], detached.id.hex(), *[actor_id for _, actor_id in started], flush=True)
time.sleep(600)
"""
ATTEMPTS = 5  # Ray may kill both racers before either reserves (one racer lost once in CI); a try takes ~6 s


def _groups_of(job: str) -> list:
    return [g for g in placement_group_records() if g.creator_job_id == job and g.state != "REMOVED"]


def _wait_for(condition, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.1)
    return found


def _ended_job_with_groups(address: str) -> tuple[str, str, object, list, list]:
    """Start and SIGKILL the driver until a racer reserved after its job ended; (job, detached group, keeper actor,
    the keeper's groups, the racers' groups)."""
    for _ in range(ATTEMPTS):
        job, detached, keeper, kept, raced = _one_try(address)
        if raced:
            return job, detached, keeper, kept, raced
        ray.kill(keeper)
        remove_placement_group(placement_group_by_hex(detached))
    pytest.fail(f"Ray killed both racers before they reserved in {ATTEMPTS} of {ATTEMPTS} tries")


def _one_try(address: str) -> tuple[str, str, object, list, list]:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, address], stdout=subprocess.PIPE, text=True)
    job, detached, *racers, keeper_id = driver.stdout.readline().split()
    driver.kill()  # as a driver dies: no goodbye, Ray ends its job and kills its ordinary actors
    driver.wait()
    keeper = ray.get_actor(f"keeper-{job}", namespace="orphans-test")
    kept = _wait_for(lambda: [g for g in _groups_of(job) if g.creator_actor_id == keeper_id], "the keeper's group")
    _wait_for(lambda: all(actor_ended(racer) for racer in racers), "the racers' death")
    time.sleep(2)  # a group asked for just before its actor died is created all the same, and Ray keeps it
    raced = [g for g in _groups_of(job) if not g.detached and g.creator_actor_id not in (keeper_id, None)]
    return job, detached, keeper, kept, raced


def test_the_group_an_ended_jobs_actor_reserved_is_released_and_no_other(ray_cluster):
    address = ray.get_runtime_context().gcs_address
    live = placement_group([{"CPU": 0.01}])  # this test's own job is alive: its group stays
    ray.get(live.ready())
    job, detached, keeper, kept, orphans = _ended_job_with_groups(address)
    kept, orphans = {g.group_id for g in kept}, {g.group_id for g in orphans}
    try:
        # 2 s after Ray killed the racers their groups are still there (the reason orphans.py exists)
        still = {g.group_id for g in _groups_of(job)}
        assert orphans <= still, "Ray now removes these groups itself: orphans.py can go"
        released = release_orphaned_placement_groups()
        assert {line.split()[0] for line in released} == orphans
        left = {g.group_id for g in placement_group_records() if g.state != "REMOVED"}
        assert {live.id.hex(), detached, *kept} <= left and not left & orphans
        ray.kill(keeper)  # once its actor is dead, Ray itself removes the keeper's group (its job counts dead)
        _wait_for(lambda: not kept & {g.group_id for g in _groups_of(job)}, "the keeper's group removed")
    finally:
        remove_placement_group(live)
        remove_placement_group(placement_group_by_hex(detached))
