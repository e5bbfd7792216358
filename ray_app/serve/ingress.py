"""What answers HTTP in front of the app (``--ingress``): Serve's Python proxy (``ray``), or Ray Serve's
high-throughput mode (``haproxy``): HAProxy on the port, ingress replicas that answer HTTP themselves, gRPC
between deployments.

On 2 CPU cores the Python proxy and the ingress replica's request path took 0.8 of a core at 64 clients (83
requests/s), HAProxy's mode 0.2 (docs/serving.md). Serve reads the mode from the environment its processes start
with, so ``kermt serve`` can choose it only for a local cluster it starts itself; a running cluster has the mode
its nodes were started with.
"""

from __future__ import annotations

import os

import ray

from ray_app.common.cluster import free_port
from ray_app.common.ray_internals import (SERVE_HAPROXY_METRICS_PORT_VARIABLE, SERVE_HAPROXY_STATS_PORT_VARIABLE,
                                          SERVE_HAPROXY_VARIABLE, SERVE_INGRESS_DRAINING_VARIABLE,
                                          SERVE_THROUGHPUT_VARIABLE)

INGRESS_DRAINING_S = 2.0

def haproxy_env() -> dict[str, str]:
    """The environment of a local cluster in HAProxy's mode. HAProxy's stats page and Prometheus exporter get free
    ports rather than their fixed defaults, so two local apps on one machine do not collide; a stopping ingress
    replica drains for 2 s, not 30 (HAProxy runs on this machine and checks it every 250 ms while it fails)."""
    return {SERVE_HAPROXY_VARIABLE: "1", SERVE_THROUGHPUT_VARIABLE: "1",
            SERVE_HAPROXY_STATS_PORT_VARIABLE: str(free_port()), SERVE_HAPROXY_METRICS_PORT_VARIABLE: str(free_port()),
            SERVE_INGRESS_DRAINING_VARIABLE: str(INGRESS_DRAINING_S)}


@ray.remote(num_cpus=0)
def _node_variable(name: str) -> str | None:
    return os.environ.get(name)


def haproxy_enabled() -> bool:
    """Whether the connected cluster's processes start in HAProxy's mode (read where Serve's processes run)."""
    return ray.get(_node_variable.remote(SERVE_HAPROXY_VARIABLE)) == "1"


__all__ = ["haproxy_enabled", "haproxy_env"]
