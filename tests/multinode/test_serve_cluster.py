"""`kermt serve` on the documented cluster layout (``pytest -m multinode``): a model read from S3, its replicas on
the worker nodes (the head has 0 CPUs), predictions over HTTP equal to `kermt predict` on the same S3 model; then
with a Featurizer deployment (``--num_featurizers 1``), which lands on a worker too."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time

import httpx
import pytest

from ray_app.serve.application import FEATURIZER_DEPLOYMENT
from tests.conftest import free_port
from tests.kermt.test_inference import ensemble_dir
from tests.multinode.conftest import WORKER_NODES, run_driver, s3
from tests.multinode.loopback import BUCKET, HEAD_IP
from tests.ray_app.serve.test_serve_command import wait_healthy

pytestmark = pytest.mark.multinode
SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "not a smiles", "CCN(CC)CC", "O=C(O)c1ccccc1"]


def upload_run(cluster, prefix: str) -> str:
    """A two-member classifier run (tests/kermt/test_inference.py's), made on the head and copied to S3."""
    import pyarrow.fs as pafs

    run = ensemble_dir(cluster.head_dir / "serve-run", "ckpt_ft_cls.pt")
    pafs.copy_files(str(run), f"{BUCKET}/{prefix}", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=cluster.s3.filesystem())
    return s3(prefix)


def replica_nodes(cluster, deployment: str) -> list[str]:
    """The IP of the node of each live replica of ``deployment`` (app ``kermt``)."""
    from ray.util.state import list_actors, list_nodes

    ips = {n.node_id: n.node_ip for n in list_nodes(address=cluster.address)}
    actors = list_actors(address=cluster.address, filters=[("class_name", "=", f"ServeReplica:kermt:{deployment}"),
                                                           ("state", "=", "ALIVE")])
    return sorted(ips[a.node_id] for a in actors)


def test_kermt_serve_from_s3_puts_replicas_on_workers_and_equals_kermt_predict(cluster):
    model = upload_run(cluster, "serve/cls-run")
    data, predicted = cluster.head_dir / "serve-in.csv", cluster.head_dir / "serve-predicted.csv"
    data.write_text("smiles\n" + "\n".join(SMILES) + "\n")
    started = time.monotonic()
    run_driver(cluster, ["predict", "--data_path", str(data), "--checkpoint_dir", model, "--output_path",
                         str(predicted)])  # first: serving takes every worker CPU
    with open(predicted) as f:
        expected = list(csv.DictReader(f))
    predict_s = time.monotonic() - started
    workers = sorted(cluster.nodes)  # the worker nodes now (a node lost by an earlier test has a replacement)
    assert len(workers) == len(WORKER_NODES)
    placed = serve_and_check(cluster, model, expected, ["--num_replicas", str(len(workers))])
    print(f"\nkermt predict from S3 {predict_s:.0f} s")
    assert placed["model-cls"] == workers  # one per worker node, none on the 0-CPU head
    # featurised by a deployment of its own: it takes the other worker's CPU, the numbers stay kermt predict's
    placed = serve_and_check(cluster, model, expected, ["--num_replicas", "1", "--num_featurizers", "1"])
    assert sorted(placed["model-cls"] + placed[FEATURIZER_DEPLOYMENT]) == workers


def settled_placement(cluster, replicas: int, timeout_s: float = 60) -> dict[str, list[str]]:
    """The node IPs of each deployment's live replicas, once ``replicas`` model replicas are alive (/healthz answers
    as soon as the ingress does, while a model replica may still be starting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        placed = {name: replica_nodes(cluster, name) for name in ("model-cls", "Gateway", FEATURIZER_DEPLOYMENT)}
        if len(placed["model-cls"]) >= replicas or time.monotonic() > deadline:
            return placed
        time.sleep(1)


def serve_and_check(cluster, model: str, expected: list[dict], flags: list[str]) -> dict[str, list[str]]:
    """`kermt serve --model cls=MODEL FLAGS` on the cluster: its answers for SMILES must equal ``expected`` (kermt
    predict's rows) to 1e-6 and SIGTERM must stop it; returns the node IPs of each deployment's replicas."""
    started, port = time.monotonic(), free_port()
    serving = subprocess.Popen([sys.executable, "-m", "ray_app.cli", "serve", "--model", f"cls={model}",
                                "--port", str(port), *flags],
                               cwd=cluster.head_dir, env=cluster.driver_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, serving, timeout_s=300)
        healthy_s = time.monotonic() - started
        body = httpx.post(f"{url}/predict", json={"smiles": SMILES}, timeout=60).json()
        placed = settled_placement(cluster, replicas=int(flags[flags.index("--num_replicas") + 1]))
        print(f"\nkermt serve {' '.join(flags)}: healthy after {healthy_s:.0f} s, replicas on {placed} "
              f"(head {HEAD_IP})")
        assert HEAD_IP not in placed["model-cls"] + placed[FEATURIZER_DEPLOYMENT]  # the head has 0 CPUs
        assert [p["smiles"] for p in body["predictions"]] == SMILES
        for entry, row in zip(body["predictions"], expected):
            assert entry["valid"] == (row["valid"].lower() == "true"), (entry, row)
            tasks = [c for c in row if c not in ("smiles", "valid", "error")]
            assert tasks and set(tasks) <= set(entry)
            for task in tasks:
                if entry["valid"]:
                    assert abs(entry[task] - float(row[task])) <= 1e-6, (task, entry, row)
                else:
                    assert entry[task] is None and row[task] in ("", "nan")
        serving.send_signal(signal.SIGTERM)
        output, _ = serving.communicate(timeout=180)
        assert serving.returncode == 0 and "SIGTERM: stopping" in output, output[-3000:]
        return placed
    finally:  # a failed assertion still stops the app (Serve's actors outlive a killed driver and hold the CPUs)
        if serving.poll() is None:
            serving.send_signal(signal.SIGTERM)
            try:
                serving.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                serving.kill()
                serving.communicate()
