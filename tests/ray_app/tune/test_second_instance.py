"""`kermt tune` beside another Ray instance on the same machine (issue 21 item 3): the sweep's own cluster is the one
every Ray process it runs addresses, so Ray Train frees the placement groups of the trials ASHA stops."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from ray_app.tune.command import main
from ray_app.tune.results import COMPLETED_STATUS, STOPPED
from tests.conftest import free_port
from tests.ray_app.common.test_worker_fit import write_sample
from tests.ray_app.tune.sweeps import read_trials, sweep_argv

RAY = Path(sys.executable).with_name("ray")


@pytest.fixture
def other_ray_instance():
    """A second Ray instance (`ray start --head`, as a user's own cluster would be), in its own process group and
    temp dir; stopped by that process group, never by `ray stop` (which stops every Ray instance of the user)."""
    temp_dir = tempfile.mkdtemp(prefix="kr-other-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Every port its own: the defaults (8265, 10001, 52365) may belong to yet another instance on this machine.
    command = [str(RAY), "start", "--head", f"--port={free_port()}", f"--dashboard-port={free_port()}",
               f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
               "--num-cpus=1", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    # A session of its own: `ray start` exits once the cluster is up, its daemons stay in its process group.
    starter = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    group = starter.pid
    try:
        output, _ = starter.communicate(timeout=120)
        assert starter.returncode == 0, output[-2000:]
        yield temp_dir
    finally:
        _stop_group(group)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _stop_group(group: int) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def placement_groups() -> dict[str, str]:
    import ray

    return {pg_id: info["state"] for pg_id, info in ray.util.placement_group_table().items()}


@pytest.mark.slow
def test_asha_sweep_beside_another_ray_instance_frees_every_placement_group(ray_cluster, other_ray_instance,
                                                                             tmp_path):
    csv_path = write_sample(tmp_path / "data.csv", 80)
    space = tmp_path / "space.yaml"  # learning rates far apart: ASHA's rung after epoch 1 stops the poor ones
    space.write_text(yaml.safe_dump({"max_lr": {"loguniform": [2e-4, 5e-2]}, "init_lr_factor": 2}))
    before = set(placement_groups())
    save_dir = tmp_path / "tune"
    # One trial at a time: trials reach the rung in the searcher's (seeded) order, so which ones ASHA stops does
    # not depend on timing.
    argv = sweep_argv((csv_path, space), save_dir, n_trials=4, concurrent=1)
    argv[argv.index("--epochs") + 1] = "3"
    assert main(argv) == 0
    trials = read_trials(save_dir)
    assert len(trials) == 4
    statuses = sorted(r["status"] for r in trials)
    assert STOPPED in statuses and COMPLETED_STATUS in statuses and set(statuses) <= {STOPPED, COMPLETED_STATUS}
    deadline = time.monotonic() + 60  # Ray Train's cleaner notices a dead controller within seconds
    while (left := {k: v for k, v in placement_groups().items() if k not in before and v != "REMOVED"}):
        assert time.monotonic() < deadline, f"placement groups left behind: {left}"
        time.sleep(1)
