"""Elastic training (``--num_workers MIN-MAX``) sized from the nodes that are alive, not from a stale node table.

Ray Train's elastic policy sizes a worker group from what Ray's autoscaling coordinator reserves for the run. The
coordinator copies the GCS's node table every 20 s, and the GCS marks a lost node dead only once its health checks
have failed (5 checks 3 s apart: 14.6 s after a SIGKILLed raylet here; up to ~65 s when the node's address goes
silent, as a preempted VM's does, each check then waiting out its 10 s timeout). The group that restarts right after
a node loss (the survivors' collectives fail within a second) is therefore sized with the lost node: its placement
group can never be placed, and every surviving worker idles for the whole worker-group start timeout
(RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 300 s in cluster.py) before Ray sizes the group again.

:class:`LiveNodesElasticPolicy` counts only what is reserved on nodes whose raylet still accepts a TCP connection.
A lost node's address refuses (or stays silent) at once; a live one accepts even when the raylet is busy, because
the kernel completes the connection whatever the process is doing. Ray already needs every node's raylet port
reachable from the other nodes (the GCS health-checks the raylet on it), wherever the Train controller runs.

Ray's private names used here are described, and checked against the installed Ray, in ray_app/common/ray_internals.py
(``ElasticScalingPolicy`` and its ``_get_reserved_resources()``); ray_app/common/trainer.py hands the policy to
Ray Train.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import ray

from ray_app.common.ray_internals import elastic_scaling_policy

logger = logging.getLogger(__name__)

# Long enough for two SYN retransmissions (Linux sends them 1 s and 3 s after the first) to a live node.
RAYLET_CONNECT_TIMEOUT_S = 5.0
# While a group is down the controller asks for a decision in a tight loop: look again at most this often.
RECHECK_INTERVAL_S = 1.0


def reachable_nodes(node_ids: Iterable[str], timeout_s: float = RAYLET_CONNECT_TIMEOUT_S) -> set[str]:
    """Of ``node_ids`` (hex, as in ``ray.nodes()``), those the GCS lists as alive and whose raylet accepts a TCP
    connection within ``timeout_s`` (all nodes are tried at once)."""
    alive = {node["NodeID"]: node for node in ray.nodes() if node.get("Alive")}
    candidates = [alive[node_id] for node_id in dict.fromkeys(node_ids) if node_id in alive]
    if not candidates:
        return set()
    with ThreadPoolExecutor(max_workers=len(candidates)) as pool:
        answers = list(pool.map(lambda node: _accepts_connection(node["NodeManagerAddress"], node["NodeManagerPort"],
                                                                 timeout_s), candidates))
    return {node["NodeID"] for node, answered in zip(candidates, answers) if answered}


def _accepts_connection(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


ElasticScalingPolicy = elastic_scaling_policy()


class LiveNodesElasticPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy, counting only the resources reserved on nodes that are reachable now.

    Both of its decisions (starting a group that is down, resizing a running one) read the reservation through
    ``_get_reserved_resources``, so neither sizes a group onto a node the GCS has not yet declared dead. What the
    lost node held is not moved to other nodes until the coordinator's next look at the GCS: the restarted group
    may be smaller than the cluster allows, and the running-group check (every
    ``ScalingConfig.elastic_resize_monitor_interval_s``) grows it later. When no reserved node answers, the
    reservation is used as Ray gives it (Ray's own behaviour), so a network that hides raylet ports from this node
    cannot keep a run from starting."""

    def __init__(self, scaling_config) -> None:
        super().__init__(scaling_config)
        self._reachable: set[str] = set()
        self._left_out: set[str] = set()
        self._checked: frozenset[str] = frozenset()
        self._checked_at = float("-inf")

    def _get_reserved_resources(self):
        reserved = super()._get_reserved_resources()
        if not reserved:  # None (the coordinator did not answer) or nothing reserved yet
            return reserved
        if frozenset(reserved) != self._checked or time.monotonic() - self._checked_at >= RECHECK_INTERVAL_S:
            reachable = reachable_nodes(reserved)
            left_out = set(reserved) - reachable
            if left_out - self._left_out and reachable:
                logger.warning("Ray Train's reservation counts lost node(s) %s (dead in the GCS, or their raylet "
                               "accepts no connection): sizing the worker group without them",
                               ", ".join(sorted(left_out - self._left_out)))
            self._reachable, self._left_out = reachable, left_out
            self._checked, self._checked_at = frozenset(reserved), time.monotonic()
        if not self._reachable:
            return reserved
        return {node_id: resources for node_id, resources in reserved.items() if node_id in self._reachable}


__all__ = ["LiveNodesElasticPolicy", "reachable_nodes"]
