"""`kermt serve` as a user runs it: its own local Ray cluster, serving in the foreground, SIGTERM stops it all
(slow: a second Ray cluster and Serve start in a subprocess, ``-m slow``), also with ``--ingress haproxy``; and an
app that joins a running Serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ray_app.serve.command import Serving, load_models
from ray_app.serve.config import ServeConfig
from ray_app.serve.models import load_served_model
from ray_app.serve.predictor import Predictor
from ray_app.serve.schemas import PredictJob
from tests.conftest import FIXTURE_DIR, free_port


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"kermt serve exited early with {process.returncode}:\n{process.stdout.read()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url}/healthz did not answer within {timeout_s} s")


def start_kermt_serve(directory: Path, port: int, *flags: str) -> subprocess.Popen:
    """`kermt serve` of the fixture classifier as a user starts it: its own local cluster, in the foreground."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "ray_app.cli", "serve", "--checkpoint_dir", str(FIXTURE_DIR / "ckpt_ft_cls.pt"),
               "--port", str(port), *flags]
    return subprocess.Popen(command, env=env, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def stop(process: subprocess.Popen) -> str:
    """SIGTERM, then its output (killed if it has not stopped in 180 s)."""
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return output


def listener(port: int) -> tuple[int, str] | None:
    """(pid, program name) of the process listening on 127.0.0.1:``port``, from /proc (Linux)."""
    wanted = f"0100007F:{port:04X}"
    inodes = {fields[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if (fields := line.split())[1] == wanted and fields[3] == "0A"}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            links = [os.readlink(fd) for fd in fd_dir.iterdir()]
        except OSError:  # a process that ended meanwhile, or not ours to read
            continue
        if any(link == f"socket:[{inode}]" for inode in inodes for link in links):
            return int(fd_dir.parent.name), (fd_dir.parent / "comm").read_text().strip()
    return None


@pytest.mark.slow
def test_kermt_serve_answers_then_stops_on_sigterm(tmp_path):
    port = free_port()
    process = start_kermt_serve(tmp_path, port)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process, timeout_s=600)
        body = httpx.post(f"{url}/predict", json={"smiles": ["CCO", "xx"]}, timeout=60).json()
        assert [p["valid"] for p in body["predictions"]] == [True, False]
    finally:
        output = stop(process)
    assert process.returncode == 0, output
    assert "SIGTERM: stopping" in output and f"127.0.0.1:{port}" in output
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=5)


@pytest.mark.slow
def test_ingress_haproxy_answers_through_haproxy_with_the_libraries_numbers_then_stops(tmp_path):
    smiles = ["CCO", "c1ccccc1O", "xx", "CC(=O)Nc1ccc(O)cc1"]
    model = load_served_model("default", FIXTURE_DIR / "ckpt_ft_cls.pt", default=True, trust_checkpoint=False)
    expected = Predictor(model, batch_size=32).predict_smiles([PredictJob(tuple(smiles))])[0]
    port = free_port()
    process = start_kermt_serve(tmp_path, port, "--ingress", "haproxy", "--num_replicas", "2")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process, timeout_s=600)
        front = listener(port)
        assert front is not None and front[1] == "haproxy", front  # not Serve's proxy actor
        with httpx.Client(base_url=url, timeout=60) as client:
            answers = [client.post("/predict", json={"smiles": smiles}).json()["predictions"] for _ in range(4)]
            malformed = client.post("/predict", json={"smiles": "CCO"})
            page = client.get("/")
    finally:
        output = stop(process)
    for predictions in answers:  # whichever replica answered: the library's numbers
        assert [p["valid"] for p in predictions] == [e["valid"] for e in expected]
        for got, want in zip(predictions, expected):
            assert all(got[task] == pytest.approx(want[task], abs=1e-6) for task in ("c1", "c2") if want["valid"])
    assert malformed.status_code == 422 and malformed.json()["detail"][0]["loc"] == ["body", "smiles"]
    assert page.status_code == 200 and "kermt" in page.text
    assert process.returncode == 0, output
    assert not Path(f"/proc/{front[0]}").exists(), "HAProxy outlived kermt serve"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=5)


def test_joining_a_running_serve_gives_that_instances_address_not_its_own_port(served):

    config = ServeConfig(checkpoint_dir=str(FIXTURE_DIR / "ckpt_ft_cls.pt"), port=free_port(), app_name="joiner")
    serving = Serving(config).start(load_models(config))
    try:
        assert not serving.started_serve and serving.url == served.url != f"http://127.0.0.1:{config.port}"
        assert serving.app_url == f"{served.url}/joiner"
        body = httpx.post(f"{serving.app_url}/predict", json={"smiles": ["CCO"]}, timeout=60).json()
        assert body["model"] == "default" and body["predictions"][0]["valid"]
    finally:
        serving.stop()


def test_ingress_haproxy_on_a_cluster_started_without_it_says_so_and_serves_through_serves_proxy(served, capsys):
    config = ServeConfig(checkpoint_dir=str(FIXTURE_DIR / "ckpt_ft_cls.pt"), app_name="joiner-haproxy",
                         ingress="haproxy")
    serving = Serving(config).start(load_models(config))
    try:
        body = httpx.post(f"{serving.app_url}/predict", json={"smiles": ["CCO"]}, timeout=60).json()
        assert body["predictions"][0]["valid"]
    finally:
        serving.stop()
    note = capsys.readouterr().err
    assert "--ingress haproxy: this cluster's nodes decide" in note and "RAY_SERVE_ENABLE_HA_PROXY=1" in note
