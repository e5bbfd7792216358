"""An autoscaling Ray cluster on one machine: Ray's fake multi-node provider (``RAY_FAKE_CLUSTER=1``).

The head has 0 CPUs and there are no worker nodes at start; the autoscaler launches up to ``max_workers`` 1-CPU
worker nodes (as processes on this machine, all on 127.0.0.1) when tasks, actors or placement groups are pending,
and removes them after ``idle_timeout_minutes``. ``ray.cluster_utils.AutoscalingCluster`` is not used: in the 2.60
wheel it needs a file that is not packaged and runs ``ray stop --force``, which kills every Ray instance here.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.conftest import free_port
from tests.multinode.loopback import BIN, kill_tree, ray_test_env


def autoscaling_config(gcs_port: int, max_workers: int) -> dict:
    return {
        "cluster_name": "kermt-fake",
        "max_workers": max_workers,
        "upscaling_speed": float(max_workers),
        "idle_timeout_minutes": 5,
        # Fake nodes are started ready: no updater (setup commands over SSH) and no launch-config hash to check.
        "provider": {"type": "fake_multinode", "gcs_address": f"127.0.0.1:{gcs_port}", "launch_multiple": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "cpu_worker": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0,
                           "max_workers": max_workers},
        },
        "head_node_type": "ray.head.default",
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


@dataclass
class FakeAutoscalingCluster:
    root: Path
    max_workers: int = 3
    port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        # every fake node is a process here: keep all of them on 127.0.0.1 (no `ray start` of a worker node runs,
        # so the single-machine flag cannot refuse them)
        return {**ray_test_env(self.root), "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

    def driver_env(self) -> dict[str, str]:
        return {**self.env(), "RAY_ADDRESS": self.address}

    def start(self) -> "FakeAutoscalingCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "autoscaling.yaml"
        config.write_text(yaml.safe_dump(autoscaling_config(self.port, self.max_workers)))
        with open(self.root / "ray_start.log", "w") as log:
            subprocess.run([str(BIN / "ray"), "start", "--head", f"--port={self.port}", "--num-cpus=0",
                            "--node-ip-address=127.0.0.1", f"--autoscaling-config={config}",
                            "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                            f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
                            "--object-store-memory=120000000", "--disable-usage-stats"],
                           env=self.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                           timeout=180, check=True)
        return self

    def worker_nodes_ever_started(self) -> int:
        """Worker nodes the autoscaler launched so far (alive or already removed), from the GCS node table."""
        probe = ("import json, ray; ray.init(); "
                 "print('NODES=' + json.dumps([n['NodeID'] for n in ray.nodes() "
                 "if 'node:__internal_head__' not in n.get('Resources', {}) or not n.get('Alive')]))")
        done = subprocess.run([str(BIN / "python"), "-c", probe], env=self.driver_env(), capture_output=True,
                              text=True, timeout=120, check=True)
        line = [line for line in done.stdout.splitlines() if line.startswith("NODES=")][-1]
        return len(json.loads(line.removeprefix("NODES=")))

    def stop(self) -> None:
        kill_tree(str(self.root))
