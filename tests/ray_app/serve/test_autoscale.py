"""`--num_replicas MIN-MAX`: under sustained load the model deployment grows to MAX replicas and shrinks back to
MIN when idle, on the session's local cluster with small thresholds (a second app joining the package's Serve).

Slow (``-m slow``): about 25 s here, most of it a second replica process starting (1 -> 2 in 9 s, 2 -> 1 in 4 s
on 2 busy cores)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from ray_app.serve.application import deployment_name
from ray_app.serve.command import Serving, load_models
from ray_app.serve.config import ServeConfig
from tests.conftest import FIXTURE_DIR

APP = "kermt-autoscale"
CLIENTS = 6  # requests in flight: 6 per replica against a target of 1, so Serve wants more replicas at once
SCALE_TIMEOUT_S = 120


def running_replicas(model: str) -> int:
    from ray import serve

    deployment = serve.status().applications[APP].deployments[deployment_name(model)]
    return deployment.replica_states.get("RUNNING", 0)


def wait_for_replicas(model: str, count: int, timeout_s: float) -> float:
    start = time.monotonic()
    while running_replicas(model) != count:
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{model}: {running_replicas(model)} running replicas after {timeout_s} s, "
                                 f"not {count}")
        time.sleep(0.5)
    return time.monotonic() - start


@pytest.mark.slow
def test_replicas_grow_under_load_and_shrink_when_idle(served):
    config = ServeConfig(checkpoint_dir=str(FIXTURE_DIR / "ckpt_ft_cls.pt"), name="small", num_replicas="1-2",
                         app_name=APP, target_ongoing_requests=1, upscale_delay_s=1, downscale_delay_s=2,
                         look_back_period_s=2)
    serving = Serving(config).start(load_models(config))
    assert not serving.started_serve  # joined the package's Serve: its proxy, under /kermt-autoscale
    url = f"{served.url}/{APP}/predict"
    stop, answers, failures = threading.Event(), [], []

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                response = http.post(url, json={"smiles": ["CCO", "c1ccccc1O", "CC(=O)Oc1ccccc1C(=O)O"]})
                (answers if response.status_code == 200 else failures).append(response.status_code)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    try:
        assert running_replicas("small") == 1
        for thread in threads:
            thread.start()
        grew_s = wait_for_replicas("small", 2, SCALE_TIMEOUT_S)
        time.sleep(2)  # both replicas answer for a while
        stop.set()
        for thread in threads:
            thread.join()
        shrank_s = wait_for_replicas("small", 1, SCALE_TIMEOUT_S)
    finally:
        stop.set()
        serving.stop()
    print(f"autoscaling: 1 -> 2 replicas in {grew_s:.1f} s under {CLIENTS} clients, 2 -> 1 in {shrank_s:.1f} s "
          f"idle; {len(answers)} requests answered, {len(failures)} failed")
    assert failures == [] and len(answers) > CLIENTS
