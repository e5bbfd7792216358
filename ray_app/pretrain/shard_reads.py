"""How a pretraining worker reads a corpus shard: itself, from the corpus's directory or URI, or, for a local corpus
on a multi-node cluster (only the driver's disk has it), through a task pinned to the driver's node that sends the
shard through the object store (ray_app.common.node_reads, which finetuning's split shards use too). Either way a
worker asks only for the shards its batches need (:mod:`kermt.data.shard_stream`); the driver reads none."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from kermt.data.corpus import Corpus, CorpusArrays, ShardInfo, read_listed_shard
from kermt.data.shard_stream import Load
from ray_app.common.node_reads import NodeRead, reading_node
from ray_app.common.storage import is_uri


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


__all__ = ["CorpusShards"]
