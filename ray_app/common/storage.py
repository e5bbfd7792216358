"""Where a run's checkpoints and Tune state live, and whether every node of the cluster can reach it.

Ray Train workers and Tune trials write their checkpoints themselves, from whichever node they run on, and the
driver reads them back. A local path therefore only works while every process shares one disk: on a single
machine, or on a filesystem every node mounts. Object storage (``s3://``, ``gs://``, any pyarrow filesystem URI)
works everywhere. On a multi-node cluster a plain local path is refused before any work starts; a shared mount is
declared explicitly with a ``file://`` URI (``file:///mnt/shared/runs``), which says "every node sees this path".
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kermt.errors import UserError, first_line

if TYPE_CHECKING:  # ray_app.common.cluster imports Ray: only where a layout is read
    from ray_app.common.cluster import ClusterLayout


def _current_layout() -> ClusterLayout:
    from ray_app.common.cluster import ClusterLayout

    return ClusterLayout.current()


def is_uri(path: str) -> bool:
    return "://" in path


CLUSTER_MAX_FAILURES = 3  # spot workers: a few preemptions per run are normal; each costs at most one epoch


def beside_uri(shown: str, suffix: str) -> str:
    """``<stem><suffix>`` beside the file at ``shown`` (a local path, or a URI whose query stays last): where the
    files a command writes beside its --output_path (kermt.run_layout.beside_output) land."""
    path, query = shown.split("?", 1) if "://" in shown and "?" in shown else (shown, None)
    parent, slash, name = path.rstrip("/").rpartition("/")
    path = f"{parent}{slash}{Path(name).stem}{suffix}"
    return path if query is None else f"{path}?{query}"


def resolve_max_failures(requested: int | None) -> int:
    """The user's value, else 3 on a multi-node cluster (where nodes come and go) and 0 on one machine."""
    if requested is not None:
        return requested
    return CLUSTER_MAX_FAILURES if _current_layout().multi_node else 0


def check_gpus(use_gpu: bool, flag: str = "--use_gpu") -> None:
    """``--use_gpu`` on a cluster without GPUs: an error on one machine (nothing would ever run), a note on a
    multi-node cluster (the autoscaler may still add GPU nodes; the runs wait for them)."""
    import ray

    if not use_gpu or ray.cluster_resources().get("GPU", 0) > 0:
        return
    if not _current_layout().multi_node:
        raise UserError(f"{flag} was given but this Ray cluster has no GPU (resources: {ray.cluster_resources()}); "
                        f"drop {flag} or attach to a cluster with GPUs (--address)")
    print(f"{flag}: no GPU in the cluster yet; the runs wait for the autoscaler to add GPU nodes", flush=True)


def resolve_storage(storage_path: str | None, default_dir: Path, flag: str = "--storage_path") -> str:
    """The storage to hand Ray Train/Tune: the user's, or ``default_dir`` (local) on a single-node cluster.

    Raises UserError on a multi-node cluster when the storage is a node-local path, and when a URI cannot be
    reached."""
    layout = _current_layout()
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
        if info.type == pafs.FileType.NotFound:  # a new prefix is fine, but its bucket (or parent) must exist
            root = path.split("/", 1)[0] if not path.startswith("/") else str(Path(path).parent)
            if filesystem.get_file_info(root).type == pafs.FileType.NotFound:
                raise UserError(f"{flag} {uri}: bucket or directory {root!r} does not exist; create it or fix the URI")
    except UserError:
        raise
    except Exception as error:  # pyarrow raises OSError/ArrowInvalid/ValueError depending on the scheme
        raise UserError(f"{flag} {uri} cannot be reached ({first_line(error)}); check the URI, the credentials "
                        f"(e.g. AWS_* variables) and the endpoint") from None
