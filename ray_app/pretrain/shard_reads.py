"""How a training worker reads a shard: itself, from the directory or URI, or, for local shards on a multi-node
cluster (only the driver's disk has them), through a task pinned to the driver's node that sends the shard through
the object store (:class:`NodeRead`: pretraining's corpus shards and finetuning's split shards both read this way).
Either way a worker asks only for the shards its batches need (:mod:`kermt.data.shard_stream`); the driver reads
none."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kermt.data.corpus import Corpus, CorpusArrays, ShardInfo, read_listed_shard
from kermt.data.shard_stream import Load
from ray_app.common.storage import is_uri
from ray_app.pretrain.corpus_read import reading_node


@dataclass(frozen=True)
class CorpusShards:
    """Where a corpus's shards are: ``path`` (absolute, or a URI) and the manifest's list; ``node``: the node whose
    disk holds a local corpus on a multi-node cluster (None: every node reads it)."""

    path: str
    shards: tuple[ShardInfo, ...]
    node: str | None = None

    @classmethod
    def of(cls, corpus: Corpus) -> "CorpusShards":
        """Called on the driver, connected: a Ray worker's working directory is not the driver's."""
        path = corpus.path if is_uri(corpus.path) else str(Path(corpus.path).resolve())
        return cls(path, corpus.manifest.shards, reading_node([corpus.path]))

    def loader(self) -> Load:
        """Reads shard i where this process runs, or on ``node`` when this process is elsewhere."""
        return NodeRead(partial(_read_corpus_shard, self.path, self.shards), self.node)


def _read_corpus_shard(path: str, shards: tuple[ShardInfo, ...], index: int) -> CorpusArrays:
    return read_listed_shard(path, shards[index])


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


__all__ = ["CorpusShards", "NodeRead"]
