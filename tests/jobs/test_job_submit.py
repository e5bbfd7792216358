"""`ray job submit` of the finetune entry point to a real Ray head started here on 127.0.0.1."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Free ports, not fixed ones: another Ray instance on the machine (a developer's, another lane's) may hold any port.
GCS_PORT, DASHBOARD_PORT, CLIENT_PORT, AGENT_PORT = (free_port() for _ in range(4))


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2", TMPDIR=str(tmp_path))
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture
def ray_head():
    """A Ray head in the foreground (--block): terminating this one process stops everything it started."""
    # A short temp dir: Ray's unix sockets live under it, and pytest's tmp paths exceed the 107-byte socket limit.
    short = Path(tempfile.mkdtemp(prefix="kr-"))
    env = _env(short)
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={GCS_PORT}",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={DASHBOARD_PORT}", f"--ray-client-server-port={CLIENT_PORT}",
         f"--dashboard-agent-listen-port={AGENT_PORT}",
         "--num-cpus=4", "--object-store-memory=200000000", "--disable-usage-stats", f"--temp-dir={short / 'ray'}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    address = f"http://127.0.0.1:{DASHBOARD_PORT}"
    deadline = time.time() + 180
    while time.time() < deadline:
        probe = subprocess.run([str(BIN / "ray"), "job", "list", "--address", address], env=env, capture_output=True)
        if probe.returncode == 0:
            break
        time.sleep(2)
    else:
        head.terminate()
        pytest.fail("the Ray head did not come up within 180 s")
    yield address, env
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
    shutil.rmtree(short, ignore_errors=True)


# slow (3 minutes with its own head node): the multi-node lane submits a sweep with `ray job submit` on every CI run
@pytest.mark.slow
def test_job_submit_runs_the_finetune_to_success(ray_head, tmp_path):
    address, env = ray_head
    save_dir = tmp_path / "job_run"
    submit = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(ROOT),
         "--runtime-env", str(ROOT / "jobs/runtime_env.yaml"), "--",
         sys.executable, "-m", "jobs.finetune", "--data_path", "tests/data/kermt_upstream/smiles.csv",
         "--checkpoint_path", "tests/data/kermt_upstream/ckpt_pretrain_vocab.pt", "--epochs", "2",
         "--batch_size", "4", "--num_workers", "2", "--split_sizes", "0.6", "0.2", "0.2", "--save_dir", str(save_dir)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    status = subprocess.run([str(BIN / "ray"), "job", "list", "--address", address], env=env, capture_output=True,
                            text=True, check=True)
    assert "status=<JobStatus.SUCCEEDED" in status.stdout or "'SUCCEEDED'" in status.stdout, status.stdout
    assert "overall_random_test_rmse=" in submit.stdout
    with open(save_dir / "fold_0/test_result.csv") as f:
        rows = list(csv.reader(f))
    assert rows[1] == ["", "t1", "t2", "t1", "t2"] and len(rows) == 2 + 6  # 26 molecules, test fraction 0.2
    assert (save_dir / "fold_0/model_0/model/model.safetensors").exists()
