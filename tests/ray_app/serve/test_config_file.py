"""serve_config.yaml's application (what `serve run` / `serve deploy` and the RayService's serveConfigV2 run): built
by its import_path from its args, as Serve does, and served over real HTTP beside the package's app; then its model
replica SIGKILLed under load, and `serve run` of the file itself (both ``-m slow``)."""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from kermt.errors import UserError
from ray_app.serve.application import deployment_name
from ray_app.serve.builder import build
from ray_app.serve.config import ServeConfig
from tests.conftest import FIXTURE_DIR, free_port
from tests.ray_app.serve.test_serve_command import wait_healthy

ROOT = Path(__file__).resolve().parents[3]
APP, PREFIX, KEY = "kermt-config-file", "/config-file", "config-file-key-0123456789"
SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "not a smiles"]


def assert_same_predictions(actual: list[dict], expected: list[dict]) -> None:
    """Entry by entry: the same keys, text and flags equal, numbers within 1e-6."""
    assert [sorted(a) for a in actual] == [sorted(e) for e in expected]
    for a, e in zip(actual, expected):
        for key, value in e.items():
            if isinstance(value, float):
                assert abs(a[key] - value) <= 1e-6, (key, a, e)
            else:
                assert a[key] == value, (key, a, e)


def config_application() -> dict:
    return yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]


def builder(import_path: str):
    module, _, attribute = import_path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass
class ConfigApp:
    model: str  # the config file's model name
    client: httpx.Client


@pytest.fixture(scope="module")
def config_app(served):
    from ray import serve

    application = config_application()
    # the fixture's classifier for the file's placeholder URI; no GPU here; one replica (the one the kill test kills)
    args = {**application["args"], "checkpoint_dir": dict(served.config.model_sources())["cls"], "use_gpu": False,
            "num_replicas": 1}
    build_app = builder(application["import_path"])
    settings = inspect.signature(build_app).parameters["args"].annotation  # what Serve validates args into
    os.environ[application["args"]["api_key_env"]] = KEY
    try:
        app = build_app(settings.model_validate(args))
    finally:
        os.environ.pop(application["args"]["api_key_env"])
    serve.run(app, name=APP, route_prefix=PREFIX)
    try:
        with httpx.Client(base_url=served.url + PREFIX, timeout=60,
                          headers={"authorization": f"Bearer {KEY}"}) as client:
            yield ConfigApp(application["args"]["name"], client)
    finally:
        serve.delete(APP)


def test_the_builder_is_what_serve_validates_args_into():
    assert config_application()["import_path"] == "ray_app.serve.builder:build"
    assert inspect.signature(build).parameters["args"].annotation is ServeConfig
    ServeConfig.model_validate(config_application()["args"])  # every key is a `kermt serve` setting


@pytest.mark.parametrize("misplaced, where", [({"port": 9000}, "http_options.port"),
                                              ({"app_name": "x"}, "applications"),
                                              ({"host": "0.0.0.0"}, "http_options.host"),
                                              ({"ingress": "haproxy"}, "RAY_SERVE_ENABLE_HA_PROXY=1")])
def test_listening_settings_in_args_are_refused_naming_their_section(misplaced, where):
    with pytest.raises(UserError, match=where):
        build(ServeConfig(checkpoint_dir="unused", **misplaced))


def test_the_config_files_app_serves_the_numbers_of_kermt_serve(config_app, served):
    assert config_app.client.get("/healthz").json() == {"status": "ok", "models": [config_app.model], "auth": True}
    assert httpx.post(f"{served.url}{PREFIX}/predict", json={"smiles": ["CCO"]}).status_code == 401  # its key
    mine = config_app.client.post("/predict", json={"smiles": SMILES}).json()
    theirs = served.client.post("/models/cls/predict", json={"smiles": SMILES}).json()  # = kermt predict (test_serve)
    assert mine["model"] == config_app.model
    assert_same_predictions(mine["predictions"], theirs["predictions"])
    assert [p["valid"] for p in mine["predictions"]] == [True, True, True, False]


@dataclass
class Load:
    """Clients posting SMILES back to back; every answer recorded as (sent at, seconds, status, body)."""

    url: str
    clients: int = 4
    answers: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, client: httpx.Client) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                response = client.post("/predict", json={"smiles": SMILES})
                self.answers.append((sent, time.monotonic() - sent, response.status_code, response.json()))
            except httpx.HTTPError as error:  # a hang (timeout) or a dropped connection
                self.answers.append((sent, time.monotonic() - sent, type(error).__name__, str(error)))

    def __enter__(self) -> "Load":
        self.threads = [threading.Thread(target=self.run, args=(self.client(),), daemon=True)
                        for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, headers={"authorization": f"Bearer {KEY}"})

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(90)


def replica_pids(model: str) -> set[int]:
    import ray
    from ray.util.state import list_actors

    actors = list_actors(address=ray.get_runtime_context().gcs_address, filters=[
        ("class_name", "=", f"ServeReplica:{APP}:{deployment_name(model)}"), ("state", "=", "ALIVE")])
    return {int(a.pid) for a in actors}


@pytest.mark.slow
def test_a_replica_sigkilled_under_load_is_restarted_and_later_requests_succeed(config_app, served):
    expected = config_app.client.post("/predict", json={"smiles": SMILES}).json()["predictions"]
    (victim,) = replica_pids(config_app.model)
    with Load(served.url + PREFIX) as load:
        time.sleep(3)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        deadline = killed_at + 120
        while not (replica_pids(config_app.model) - {victim}) and time.monotonic() < deadline:
            time.sleep(0.2)
        replaced_at = time.monotonic()
        while time.monotonic() < deadline and not any(a[0] > replaced_at and a[2] == 200 for a in load.answers):
            time.sleep(0.2)
        time.sleep(3)
    answers = sorted(load.answers)
    before = [a for a in answers if a[0] + a[1] < killed_at]
    during = [a for a in answers if a not in before]
    failed = [a for a in during if a[2] != 200]
    first_ok = min(a[0] + a[1] for a in during if a[0] > killed_at and a[2] == 200)
    print(f"\nSIGKILL of replica pid {victim} under {load.clients} clients: {len(before)} requests before, "
          f"{len(during)} from the kill on, {len(failed)} failed {sorted({str(a[2]) for a in failed})}; "
          f"a new replica alive {replaced_at - killed_at:.1f} s after the kill, the first success after it "
          f"{first_ok - killed_at:.1f} s; slowest answer {max(a[1] for a in answers):.1f} s; "
          f"messages: {sorted({a[3]['detail'] for a in failed if isinstance(a[3], dict)})}")
    assert replica_pids(config_app.model) - {victim}, "Serve did not start another replica within 120 s"
    assert all(a[2] == 200 for a in before)
    assert all(isinstance(a[2], int) and a[2] >= 500 and a[3].get("detail") for a in failed), failed  # no hang
    later = [a for a in answers if a[0] > first_ok]
    assert later and all(a[2] == 200 for a in later)
    for answer in later:
        assert_same_predictions(answer[3]["predictions"], expected)


@pytest.mark.slow
def test_serve_run_of_the_config_file_builds_the_app_in_serves_own_path(tmp_path):
    """`serve run serve_config.yaml` as a user runs it (its own local cluster): Serve imports the builder, validates
    ``args`` into ServeConfig and builds the app in a task on the cluster; the model answers over HTTP."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    config["http_options"] = {"host": "127.0.0.1", "port": port}  # loopback on a free port for the test
    args = config["applications"][0]["args"]
    args.update(checkpoint_dir=str(FIXTURE_DIR / "ckpt_ft_cls.pt"), use_gpu=False, num_replicas=1)
    (tmp_path / "serve_config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", args["api_key_env"]: KEY}
    env.pop("RAY_ADDRESS", None)
    process = subprocess.Popen([str(Path(sys.executable).parent / "serve"), "run", "serve_config.yaml"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process, timeout_s=600)
        response = httpx.post(f"{url}/predict", json={"smiles": SMILES}, timeout=60,
                              headers={"authorization": f"Bearer {KEY}"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == args["name"]
        assert [p["valid"] for p in body["predictions"]] == [True, True, True, False]
    finally:
        process.send_signal(signal.SIGINT)  # serve run's own stop: it removes the app and the cluster it started
        try:
            process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
