"""Which node must read local files, and reading a shard there: a local path on a multi-node cluster is on the
driver's disk only, so a process elsewhere asks a task pinned to the driver's node, which sends the shard through
the object store. Pretraining's corpus (its read tasks and its workers' shards) and finetuning's split shards
follow this one rule."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_app.common.cluster import ClusterLayout
from ray_app.common.storage import is_uri


def reading_node(paths: Sequence[str]) -> str | None:
    """Called on the driver, connected: the node that must read ``paths`` (the driver's, when a local file is only
    on its disk on a multi-node cluster), or None when any node reads them."""
    if all(is_uri(p) for p in paths) or not ClusterLayout.current().multi_node:
        return None
    return ray.get_runtime_context().get_node_id()


@dataclass(frozen=True)
class NodeRead:
    """``read(i)`` where the calling process runs when ``node`` is None or its own, else in a task pinned to
    ``node`` (whose disk holds the files). Decided per call, so the same object works on every worker."""

    read: Callable[[int], Any]
    node: str | None = None

    def __call__(self, index: int) -> Any:
        if self.node is None or ray.get_runtime_context().get_node_id() == self.node:
            return self.read(index)
        pinned = _read_on_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(self.node, soft=False))
        return ray.get(pinned.remote(self.read, index))


@ray.remote(num_cpus=0)
def _read_on_node(read: Callable[[int], Any], index: int) -> Any:
    return read(index)


__all__ = ["NodeRead", "reading_node"]
