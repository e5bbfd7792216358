"""Where a run's checkpoints and Tune state live, and whether every node of the cluster can reach it.

Ray Train workers and Tune trials write their checkpoints themselves, from whichever node they run on, and the
driver reads them back. A local path therefore only works while every process shares one disk: on a single
machine, or on a filesystem every node mounts. Object storage (``s3://``, ``gs://``, any pyarrow filesystem URI)
works everywhere. On a multi-node cluster a plain local path is refused before any work starts; a shared mount is
declared explicitly with a ``file://`` URI (``file:///mnt/shared/runs``), which says "every node sees this path".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ray

from kermt.errors import UserError

SHARED_FILE_SCHEME = "file://"


def is_uri(path: str) -> bool:
    return "://" in path


def local_path(uri_or_path: str) -> Path | None:
    """The local directory behind ``path`` or ``file://path``; None for remote storage."""
    if uri_or_path.startswith(SHARED_FILE_SCHEME):
        return Path(uri_or_path[len(SHARED_FILE_SCHEME):])
    return None if is_uri(uri_or_path) else Path(uri_or_path).resolve()


@dataclass(frozen=True)
class ClusterLayout:
    """What decides whether node-local paths are safe: how many nodes there are (or may be) and where work runs."""

    alive_nodes: int
    head_cpus: float

    @staticmethod
    def current() -> "ClusterLayout":
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        head = [n for n in nodes if "node:__internal_head__" in n.get("Resources", {})]
        head_cpus = head[0]["Resources"].get("CPU", 0.0) if head else 0.0
        return ClusterLayout(len(nodes), head_cpus)

    @property
    def multi_node(self) -> bool:
        # A head without CPUs runs no trainer or task itself: every worker sits on another machine, even while
        # the autoscaler has not started it yet.
        return self.alive_nodes > 1 or self.head_cpus == 0


CLUSTER_MAX_FAILURES = 3  # spot workers: a few preemptions per run are normal; each costs at most one epoch


def resolve_max_failures(requested: int | None) -> int:
    """The user's value, else 3 on a multi-node cluster (where nodes come and go) and 0 on one machine."""
    if requested is not None:
        return requested
    return CLUSTER_MAX_FAILURES if ClusterLayout.current().multi_node else 0


def resolve_storage(storage_path: str | None, default_dir: Path, flag: str = "--storage_path") -> str:
    """The storage to hand Ray Train/Tune: the user's, or ``default_dir`` (local) on a single-node cluster.

    Raises UserError on a multi-node cluster when the storage is a node-local path, and when a URI cannot be
    reached."""
    layout = ClusterLayout.current()
    if storage_path is None:
        if layout.multi_node:
            raise UserError(_local_refusal(flag, f"defaults to {default_dir} on this machine", layout))
        return str(default_dir)
    if not is_uri(storage_path):
        if layout.multi_node:
            raise UserError(_local_refusal(flag, f"{storage_path!r} is a path on this machine", layout))
        return str(Path(storage_path).resolve())
    check_reachable(storage_path, flag)
    return storage_path


def _local_refusal(flag: str, what: str, layout: ClusterLayout) -> str:
    nodes = f"{layout.alive_nodes} node(s)" + (" and a head without CPUs" if layout.head_cpus == 0 else "")
    return (f"{flag} {what}, but this cluster has {nodes}: workers on other machines cannot write there, so "
            f"checkpoints would be lost. Pass {flag} s3://bucket/prefix (or gs://..., or file:///path for a "
            f"filesystem every node mounts)")


def check_reachable(uri: str, flag: str = "--storage_path") -> None:
    """One cheap listing of ``uri``; a clear error instead of a failure deep inside a worker."""
    import pyarrow.fs as pafs

    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.File:
            raise UserError(f"{flag} {uri} is a file; give a directory (prefix)")
        if info.type == pafs.FileType.NotFound:  # a new prefix is fine, but its bucket must exist
            parent = path.split("/", 1)[0]
            if filesystem.get_file_info(parent).type == pafs.FileType.NotFound:
                raise UserError(f"{flag} {uri}: bucket or root {parent!r} does not exist; create it or fix the URI")
    except UserError:
        raise
    except Exception as error:  # pyarrow raises OSError/ArrowInvalid/ValueError depending on the scheme
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"{flag} {uri} cannot be reached ({first_line}); check the URI, the credentials "
                        f"(e.g. AWS_* variables) and the endpoint") from None


def download_directory(uri: str, destination: Path) -> None:
    """Copy a storage directory (URI or local path) to a local one."""
    import pyarrow.fs as pafs

    destination.mkdir(parents=True, exist_ok=True)
    filesystem, path = (pafs.LocalFileSystem(), str(local_path(uri))) if local_path(uri) else \
        pafs.FileSystem.from_uri(uri)
    pafs.copy_files(path, str(destination), source_filesystem=filesystem,
                    destination_filesystem=pafs.LocalFileSystem())
