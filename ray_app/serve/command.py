"""`kermt serve`: check the models, start (or join) Ray and Ray Serve, serve in the foreground until SIGINT or
SIGTERM, then stop exactly what this command started: its application always, Ray Serve and the local Ray
cluster only when it started them (an app of someone else on a shared cluster is never touched)."""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass

from kermt.errors import UserError
from ray_app.common.remote_files import fetch_input
from ray_app.common.settings import build_parser, resolve
from ray_app.serve.config import ServeConfig
from ray_app.serve.models import ServedModel, load_served_model

PROG = "kermt serve"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_models(config: ServeConfig) -> list[ServedModel]:
    """Every model, read and checked on the driver (URIs fetched first), the default first."""
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

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self, models: list[ServedModel]) -> "Serving":
        import ray
        from ray import serve

        from ray_app.common.cluster import connect
        from ray_app.serve.application import build_app

        self.started_ray = not ray.is_initialized()
        connect(self.config.address)
        status = serve.status()
        if self.config.app_name in status.applications:
            raise UserError(f"a Serve application named {self.config.app_name!r} already runs on this cluster; "
                            "pick another --app_name (or stop that one)")
        self.started_serve = not status.proxies
        if self.started_serve:
            serve.start(http_options={"host": self.config.host, "port": self.config.port})
        serve.run(build_app(self.config, models), name=self.config.app_name,
                  route_prefix=f"/{self.config.app_name}" if not self.started_serve else "/")
        self.running = True
        return self

    def stop(self) -> None:
        import ray
        from ray import serve

        if self.running:
            serve.delete(self.config.app_name)
            self.running = False
        if self.started_serve:
            serve.shutdown()
            self.started_serve = False
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def wait_for_stop_signal() -> int:
    """Block until SIGINT or SIGTERM; returns the signal's number."""
    received: list[int] = []
    stop = threading.Event()

    def handler(signum, _frame) -> None:
        received.append(signum)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return received[0]


def run_serve(config: ServeConfig) -> int:
    models = load_models(config)  # before Ray starts: a wrong path costs a second
    serving = Serving(config)
    try:
        serving.start(models)
        names = ", ".join(f"{m.name} ({len(m.members)} member(s))" for m in models)
        log(f"serving {names} at {serving.url}{'' if serving.started_serve else '/' + config.app_name} "
            "(POST /predict, GET /models, /docs); Ctrl-C or SIGTERM stops")
        signum = wait_for_stop_signal()
        log(f"{signal.Signals(signum).name}: stopping")
    finally:
        serving.stop()
    return 0


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        build_parser(PROG, ServeConfig).print_help()
        return 0
    config, _ = resolve(argv, ServeConfig, PROG)
    return run_serve(config)


__all__ = ["Serving", "load_models", "main", "run_serve", "wait_for_stop_signal"]
