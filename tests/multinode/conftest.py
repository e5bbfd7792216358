"""The multi-node lane's cluster (``pytest -m multinode``): one for the lane's modules (starting one takes ~20-40 s),
stopped by process tree. A test that loses a node adds a replacement on a new address, so the tests after it see
two worker nodes again (``cluster.nodes`` names them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.multinode.loopback import BUCKET, LoopbackCluster

ROOT = Path(__file__).resolve().parents[2]
WORKER_NODES = {"127.0.0.3": 1, "127.0.0.4": 1}  # one training worker per node, like one GPU per node


@pytest.fixture(scope="session")
def cluster():
    if shutil.which("unshare") is None:
        pytest.skip("the multi-node lane needs util-linux `unshare` (private per-node filesystems)")
    root = Path(tempfile.mkdtemp(prefix="kmn-", dir="/tmp"))  # short: Unix socket paths are limited
    loopback = LoopbackCluster(root)
    try:
        loopback.start(WORKER_NODES)
        yield loopback
    finally:
        loopback.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def cluster_left_idle(request):
    """After every test on a loopback cluster: every CPU is free again within two minutes (a run that leaves an
    actor or a placement group behind would starve the tests after it; this names what it left)."""
    yield
    if "cluster" in request.fixturenames:
        report = request.getfixturevalue("cluster").wait_until_idle()
        assert report["free_cpus"] >= report["total_cpus"], f"the cluster is not idle after the test: {report}"


@pytest.fixture(scope="module")
def head_inputs(cluster) -> dict[str, Path]:
    """The sample data and the fixture checkpoint on the head's disk only (worker nodes cannot see them)."""
    inputs = cluster.head_dir / "inputs"
    inputs.mkdir(exist_ok=True)
    files = {"data": ROOT / "data/sample/admet_demo.csv",
             "checkpoint": ROOT / "tests/data/kermt_upstream/ckpt_pretrain_vocab.pt"}
    return {name: Path(shutil.copy(path, inputs / path.name)) for name, path in files.items()}


def run_driver(cluster: LoopbackCluster, args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    """``kermt ARGS`` as a driver on the head, attached by address; fails the test with its output on error or
    when it runs past ``timeout`` (with what holds the cluster's resources then)."""
    try:
        done = subprocess.run([sys.executable, "-m", "ray_app.cli", *args], cwd=cluster.head_dir,
                              env=cluster.driver_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        # on POSIX the partial output is the undecoded bytes read so far
        stdout, stderr = (_text(stream) for stream in (expired.stdout, expired.stderr))
        pytest.fail(f"kermt {' '.join(args)} ran past {timeout} s; the cluster after killing it: "
                    f"{cluster.wait_until_idle(30)}\n{stdout[-4000:]}\n{stderr[-6000:]}")
    assert done.returncode == 0, f"kermt {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return done


def _text(stream: bytes | str | None) -> str:
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream or ""


def s3(prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix}"
