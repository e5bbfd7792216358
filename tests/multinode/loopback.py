"""A Ray cluster laid out like the documented one, on one machine: the multi-node test lane's cluster.

- The head (127.0.0.2) has 0 CPUs, as in ``cluster.yaml`` / the RayJob: it only schedules and hosts the driver.
  Not 127.0.0.1: Ray rewrites that address to the host's network address (``resolve_ip_for_localhost``), and a
  worker node would then dial the host's address instead of loopback.
- Each worker node is a raylet on its own loopback address (127.0.0.3, 127.0.0.4, ...), so node resources
  (``node:<ip>``) differ as they do on a real cluster, and each runs in its own mount namespace with a private
  tmpfs over the head's directory: a worker cannot read what the driver wrote there, and what a worker writes to
  "the same" local path stays invisible to the driver, exactly as on separate machines.
- Object storage is a moto S3 server on 127.0.0.1 (as Ray's own storage tests use); every node gets the endpoint
  and test credentials through the environment, so plain ``s3://bucket/prefix`` URIs work everywhere.

Everything is started with ``ray start`` by this module and stopped by process tree (never ``ray stop``, which
would kill every Ray instance on the machine).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port
from tests.s3_server import BUCKET, MotoS3

BIN = Path(sys.executable).parent
HEAD_IP = "127.0.0.2"

# Run as a driver on the head: wait until no CPU of the cluster is held (every run's actors and placement groups
# released) and, with a third argument, until Ray's autoscaling coordinator holds no live resource request; then print
# what still holds resources, as JSON. The coordinator (a detached actor Ray Data and Train V2's elastic policy share)
# keeps a request until its requester cancels it or it expires (Ray Data: 180 s): a driver that was SIGKILLed never
# cancels, and until then an elastic run is sized from what the stale request leaves over.
IDLE_PROBE = """
import json, sys, time
import ray
from ray.util.state import list_actors, list_placement_groups
ray.init(logging_level="ERROR")
deadline, want_no_requests = time.monotonic() + float(sys.argv[1]), len(sys.argv) > 2

def coordinator_requests():
    try:
        coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    except ValueError:  # no run has created it yet
        return []
    def live(actor):
        now = time.time()
        return [f"{rid} wants {r.requested_resources} (remaining {sorted(r.request_remaining or [])}) for "
                f"{r.expiration_time - now:.0f} s more"
                for rid, r in actor._ongoing_reqs.items() if r.expiration_time > now]
    return ray.get(coordinator.__ray_call__.remote(live))

while True:
    total, free = ray.cluster_resources(), ray.available_resources()
    requests = coordinator_requests()
    idle = free.get("CPU", 0) >= total.get("CPU", 0) and not (want_no_requests and requests)
    if idle or time.monotonic() > deadline:
        break
    time.sleep(1)
actors = [f"{a.class_name} pid={a.pid} node={a.node_id} job={a.job_id}"
          for a in list_actors(filters=[("state", "=", "ALIVE")])]
groups = [f"{g.placement_group_id} {g.state} job={g.creator_job_id} detached={g.is_detached}"
          for g in list_placement_groups(filters=[("state", "!=", "REMOVED")], detail=True)]
print(json.dumps({"total_cpus": total.get("CPU", 0), "free_cpus": free.get("CPU", 0), "actors": actors,
                  "placement_groups": groups, "coordinator_requests": requests}))
"""


def _process_table() -> tuple[dict[int, int], dict[int, str]]:
    parents, commands = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                commands[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            pass
    return parents, commands


def kill_tree(marker: str) -> int:
    """SIGKILL every process whose command line contains ``marker``, and all their descendants."""
    parents, commands = _process_table()
    chosen = {pid for pid, cmd in commands.items() if marker in cmd and pid != os.getpid()}
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in chosen and pid not in chosen}
        chosen |= children
        grew = bool(children)
    for pid in chosen:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(chosen)


def ray_test_env(temp_dir: Path) -> dict[str, str]:
    """This process's environment for Ray processes a test starts: their own temp dir, quiet and fast settings."""
    env = dict(os.environ)
    # Not inherited from the test process (tests/ray_app/conftest.py sets the second for its local cluster):
    # with it, `ray start --address` refuses to join a worker node.
    for key in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(key, None)
    env.update({
        "RAY_TMPDIR": str(temp_dir), "TMPDIR": str(temp_dir),
        "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "300",
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "PYTHONUNBUFFERED": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # a job's `python` is this environment's
    })
    return env


@dataclass
class LoopbackCluster:
    """``root`` must be short (Unix socket paths are limited to 107 bytes)."""

    root: Path
    object_store_mb: int = 120
    port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    nodes: dict[str, int] = field(default_factory=dict)  # worker node ip -> CPUs
    s3: MotoS3 = field(init=False)

    def __post_init__(self) -> None:
        self.s3 = MotoS3(self.root / "s3")

    @property
    def head_dir(self) -> Path:
        """The head's own disk: its Ray temp dir, the driver's inputs and outputs."""
        return self.root / "head"

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://{HEAD_IP}:{self.dashboard_port}"

    def env(self, temp_dir: Path | None = None) -> dict[str, str]:
        """Environment of every node and of drivers attached to this cluster."""
        # The worker-group start timeout stays at ray_test_env's 300 s, as in ray_app.common.cluster: an elastic
        # restart sized with a lost node would wait all of it (ray_app/common/elastic.py), which the elastic test's
        # recovery figure shows.
        return {**ray_test_env(temp_dir or self.head_dir), **self.s3.env()}

    def driver_env(self) -> dict[str, str]:
        """A driver on the head node, attached by address (as `ray job submit` or `--address` attach one)."""
        return {**self.env(self.root / "driver"), "RAY_ADDRESS": self.address}

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self, worker_nodes: dict[str, int]) -> "LoopbackCluster":
        for directory in (self.head_dir, self.root / "driver"):
            directory.mkdir(parents=True, exist_ok=True)
        os.environ.update(self.s3.env())  # this test process lists the bucket too
        self.s3.start(BUCKET)
        self._ray_start(["--head", f"--port={self.port}", f"--node-ip-address={HEAD_IP}", "--num-cpus=0",
                         f"--dashboard-host={HEAD_IP}", f"--dashboard-port={self.dashboard_port}",
                         f"--ray-client-server-port={free_port()}"], self.env())
        for ip, cpus in worker_nodes.items():
            self.add_node(ip, cpus)
        return self

    def add_node(self, ip: str, cpus: int) -> None:
        """A worker node on ``ip`` whose view of the head's directory is an empty private tmpfs."""
        temp_dir = self.root / ip
        temp_dir.mkdir(parents=True, exist_ok=True)
        args = [f"--address={self.address}", f"--node-ip-address={ip}", f"--num-cpus={cpus}"]
        self._ray_start(args, self.env(temp_dir), wrap=lambda command: [
            "unshare", "-m", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs tmpfs {shlex.quote(str(self.head_dir))} && exec {shlex.join(command)}"])
        self.nodes[ip] = cpus

    def kill_node(self, ip: str) -> int:
        """Lose a worker node at once (SIGKILL of its raylet and everything on it), as a spot preemption does."""
        self.nodes.pop(ip, None)
        return kill_tree(f"--node-ip-address={ip} ") + kill_tree(f"--node_ip_address={ip} ")

    def stop(self) -> None:
        kill_tree(str(self.root))
        # the head's Ray client server (started by `ray start --head`) names the head's address, not the lane's folder
        kill_tree(f"--address={self.address} ")
        self.s3.stop()

    def _ray_start(self, args: list[str], env: dict[str, str], wrap=lambda command: command) -> None:
        self._run(wrap([str(BIN / "ray"), "start", f"--object-store-memory={self.object_store_mb * 2**20}",
                   "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}", *args]), env)

    def _run(self, command: list[str], env: dict[str, str]) -> None:
        # Output to a file, not a pipe: the daemons `ray start` leaves behind inherit it and would hold a pipe open.
        log = self.root / "ray_start.log"
        with open(log, "a") as out:
            done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed:\n{log.read_text()[-3000:]}")

    def wait_until_idle(self, timeout: float = 120, no_requests: bool = False) -> dict:
        """Wait until every CPU of the cluster is free again (``no_requests``: and the autoscaling coordinator holds
        no live request, see IDLE_PROBE); returns the cluster's resources and what is still alive (actors,
        placement groups, coordinator requests) at the end, so that a run that leaks them is named."""
        args = [str(timeout), *(["no_requests"] if no_requests else [])]
        done = subprocess.run([sys.executable, "-c", IDLE_PROBE, *args], env=self.driver_env(),
                              capture_output=True, text=True, timeout=timeout + 120)
        if done.returncode != 0:
            raise RuntimeError(f"the idle probe failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def make_bucket(self, name: str) -> None:
        self.s3.make_bucket(name)

    def s3_listing(self, prefix: str) -> list[str]:
        """Every object key under ``s3://prefix`` (bucket/path)."""
        return self.s3.listing(prefix)
