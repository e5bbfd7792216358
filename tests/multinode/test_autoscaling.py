"""Autoscaling: an ensemble on a cluster that starts with no worker nodes makes the autoscaler add them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.multinode.autoscaling import FakeAutoscalingCluster
from tests.multinode.conftest import ROOT

pytestmark = pytest.mark.multinode


@pytest.fixture(scope="module")
def autoscaling_cluster():
    root = Path(tempfile.mkdtemp(prefix="kas-", dir="/tmp"))
    cluster = FakeAutoscalingCluster(root, max_workers=3)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_pending_members_scale_a_cluster_out_from_zero_worker_nodes(autoscaling_cluster):
    """No --max_concurrent_trials: on a multi-node cluster every member is started, the ones that do not fit wait
    as pending placement groups, and the autoscaler adds worker nodes for them."""
    cluster = autoscaling_cluster
    assert cluster.worker_nodes_ever_started() == 0
    save_dir = cluster.root / "ens"
    args = ["finetune", "--config", str(ROOT / "jobs/configs/demo_distributed.yaml"), "--data_path",
            str(ROOT / "data/sample/admet_demo.csv"), "--checkpoint_path",
            str(ROOT / "tests/data/kermt_upstream/ckpt_pretrain_vocab.pt"), "--max_data_size", "200",
            "--epochs", "1", "--num_workers", "1", "--ensemble_size", "4", "--save_dir", str(save_dir),
            # every fake node is a process on this machine, so this path is shared, and says so
            "--storage_path", f"file://{cluster.root / 'storage'}"]
    done = subprocess.run([sys.executable, "-m", "ray_app.cli", *args], cwd=cluster.root, env=cluster.driver_env(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "training 4 models (1 fold(s) x 4 member(s)), 4 at a time" in done.stdout
    assert cluster.worker_nodes_ever_started() >= 2
    assert sorted(p.name for p in (save_dir / "fold_0").glob("model_*")) == [f"model_{m}" for m in range(4)]
    assert (cluster.root / "storage").is_dir()  # the checkpoints went to the declared shared path
