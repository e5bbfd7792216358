"""`kermt serve`: check the models, start (or join) Ray and Ray Serve, serve in the foreground until SIGINT or
SIGTERM, then stop exactly what this command started: its application always, Ray Serve and the local Ray
cluster only when it started them (an app of someone else on a shared cluster is never touched)."""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kermt.errors import UserError
from ray_app.common.remote_files import fetch_input
from ray_app.common.command import run_command
from ray_app.common.ray_internals import (SERVE_HAPROXY_VARIABLE, SERVE_THROUGHPUT_VARIABLE,
                                          running_serve_http_options)
from ray_app.serve.config import ServeConfig

if TYPE_CHECKING:  # torch, RDKit, FastAPI: imported when the command runs, not for `kermt serve --help`
    from ray_app.serve.models import ServedModel

PROG = "kermt serve"
STOP_STEP_S = 60.0  # the longest one stop step may take (Serve drains a replica in seconds)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_models(config: ServeConfig) -> list[ServedModel]:
    """Every model, read and checked on the driver (URIs fetched first), the default first."""
    from ray_app.serve.models import load_served_model

    return [load_served_model(name, fetch_input(source, f"model {name!r}"), default=i == 0,
                              trust_checkpoint=config.trust_checkpoint)
            for i, (name, source) in enumerate(config.model_sources())]


@dataclass
class Serving:
    """A running app and what was started for it (so that stopping undoes only that)."""

    config: ServeConfig
    started_ray: bool = False
    started_serve: bool = False
    running: bool = False
    listening: tuple[str, int] | None = None  # host, port of a Serve instance this app joined (not --host/--port)

    @property
    def url(self) -> str:
        host, port = self.listening or (self.config.host, self.config.port)
        return f"http://{host}:{port}"

    @property
    def app_url(self) -> str:
        """Where this app's routes are: the instance's root, or /<app_name> on an instance it joined."""
        return self.url if self.started_serve else f"{self.url}/{self.config.app_name}"

    def start(self, models: list[ServedModel], stop_signal: "StopSignal | None" = None) -> "Serving":
        import ray
        from ray import serve

        from ray_app.common.cluster import connect
        from ray_app.serve.application import serving_app
        from ray_app.serve.ingress import haproxy_enabled, haproxy_env

        self.started_ray = not ray.is_initialized()
        # Serve's processes read the ingress mode from the environment a local cluster starts with
        connect(self.config.address, local_env=haproxy_env if self.config.ingress == "haproxy" else None)
        if stop_signal is not None:  # from here on: ray.init installed its own SIGTERM handler, which exits at once
            stop_signal.catch()
        if self.config.ingress == "haproxy" and not haproxy_enabled():
            log("--ingress haproxy: this cluster's nodes decide what answers HTTP (Serve's Python proxy here); start "
                f"them with {SERVE_HAPROXY_VARIABLE}=1 {SERVE_THROUGHPUT_VARIABLE}=1 for HAProxy (docs/serving.md)")
        status = serve.status()
        if self.config.app_name in status.applications:
            raise UserError(f"a Serve application named {self.config.app_name!r} already runs on this cluster; "
                            "pick another --app_name (or stop that one)")
        self.started_serve = not status.proxies
        if self.started_serve:
            serve.start(http_options={"host": self.config.host, "port": self.config.port})
        else:
            options = running_serve_http_options() or {}
            self.listening = options.get("host", self.config.host), int(options.get("port", self.config.port))
        serve.run(serving_app(self.config, models), name=self.config.app_name,
                  route_prefix=f"/{self.config.app_name}" if not self.started_serve else "/")
        self.running = True
        return self

    def stop(self) -> None:
        import ray
        from ray import serve

        if self.running:
            _bounded(lambda: serve.delete(self.config.app_name), f"removing the application {self.config.app_name!r}")
            self.running = False
        if self.started_serve:
            _bounded(serve.shutdown, "stopping Ray Serve")
            self.started_serve = False
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def _bounded(step, what: str, seconds: float = STOP_STEP_S) -> None:
    """Run one stop step, giving up after ``seconds``: when the cluster itself is already gone (a signal sent to
    the whole process group also stops the local raylet), Serve's calls would wait for it forever."""
    worker = threading.Thread(target=step, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        log(f"{what} did not finish within {seconds:.0f} s (is the Ray cluster still up?); going on")


class StopSignal:
    """SIGINT/SIGTERM recorded from :meth:`catch` on (a signal during start-up is not lost: the app stops as soon as
    it is up); :meth:`wait` blocks until one came and puts the previous handlers back."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: int | None = None
        self._event = threading.Event()
        self._previous: dict[int, object] = {}

    def _handler(self, signum, _frame) -> None:
        self.received = signum
        self._event.set()

    def catch(self) -> None:
        for s in self.SIGNALS:
            previous = signal.signal(s, self._handler)
            self._previous.setdefault(s, previous)

    def wait(self) -> int:
        self.catch()
        try:
            while not self._event.wait(0.5):
                pass
        finally:
            for s, handler in self._previous.items():
                signal.signal(s, handler)
        return self.received


def wait_for_stop_signal() -> int:
    """Block until SIGINT or SIGTERM; returns the signal's number."""
    return StopSignal().wait()


def run_serve(config: ServeConfig) -> int:
    from ray_app.serve.auth import exposure_warning, read_api_key

    warning = exposure_warning(config.host, config.api_key_env)
    if warning:
        log(warning)
    if config.api_key_env:
        read_api_key(config.api_key_env)  # an unset variable is named before anything starts
    models = load_models(config)  # before Ray starts: a wrong path costs a second
    serving, stop_signal = Serving(config), StopSignal()
    try:
        serving.start(models, stop_signal)
        names = ", ".join(f"{m.name} ({len(m.members)} member(s))" for m in models)
        joined = "" if serving.listening in (None, (config.host, config.port)) else (
            f" (Ray Serve already ran on this cluster: its address, not --host {config.host} --port {config.port})")
        log(f"serving {names} at {serving.app_url}{joined} (POST /predict, GET /models, /docs); "
            "Ctrl-C or SIGTERM stops")
        signum = stop_signal.wait()
        log(f"{signal.Signals(signum).name}: stopping")
    finally:
        serving.stop()
    return 0


def main(argv: list[str]) -> int:
    return run_command(PROG, ServeConfig, argv, lambda config, _sources: run_serve(config))


__all__ = ["Serving", "StopSignal", "load_models", "main", "run_serve", "wait_for_stop_signal"]
