"""`kermt serve` as a user runs it: its own local Ray cluster, serving in the foreground, SIGTERM stops it all
(slow: a second Ray cluster and Serve start in a subprocess, ``-m slow``); and an app that joins a running Serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from ray_app.serve.command import Serving, load_models
from ray_app.serve.config import ServeConfig
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


@pytest.mark.slow
def test_kermt_serve_answers_then_stops_on_sigterm(tmp_path):
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "ray_app.cli", "serve", "--checkpoint_dir", str(FIXTURE_DIR / "ckpt_ft_cls.pt"),
               "--port", str(port)]
    process = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process, timeout_s=600)
        body = httpx.post(f"{url}/predict", json={"smiles": ["CCO", "xx"]}, timeout=60).json()
        assert [p["valid"] for p in body["predictions"]] == [True, False]
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, output
    assert "SIGTERM: stopping" in output and f"127.0.0.1:{port}" in output
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
