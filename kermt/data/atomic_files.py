"""Files on a local disk or behind a pyarrow filesystem URI (``s3://``, ``gs://``, ``file://``), written atomically.

A reader must never see half a file: each write goes to a temporary sibling that is then moved onto the target (a
rename on a local disk; on object stores the object appears whole when its upload completes).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) of a local path or a URI (``s3://...``, ``file:///...``)."""
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), str(pafs.LocalFileSystem().normalize_path(str(Path(path).absolute())))


def join(base: str, *parts: str) -> str:
    """``base`` extended by ``parts`` on its path part. A URI's query stays last: pyarrow reads options there
    (``s3://bucket/run?endpoint_override=host:9000&scheme=http`` for MinIO, Ceph and other S3-compatible stores), so
    ``s3://bucket/run?...`` joined with ``name`` is ``s3://bucket/run/name?...``, not a path inside the query."""
    path, query = base.split("?", 1) if "://" in base and "?" in base else (base, None)
    joined = "/".join([path.rstrip("/"), *(part.strip("/") for part in parts)])
    return joined if query is None else f"{joined}?{query}"


def write_atomically(path: str, write: Callable[[pafs.FileSystem, str], None]) -> None:
    """``write(fs, tmp_path)`` writes a temporary sibling, then it is moved onto ``path`` (a rename on local disks)."""
    fs, target = filesystem(path)
    parent = target.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{target.rsplit('/', 1)[1]}"
    try:
        write(fs, tmp)
        fs.move(tmp, target)
    finally:
        if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
            fs.delete_file(tmp)


def write_text(path: str, text: str) -> None:
    def write(fs: pafs.FileSystem, tmp: str) -> None:
        with fs.open_output_stream(tmp) as out:
            out.write(text.encode("utf-8"))

    write_atomically(path, write)


def read_text(path: str) -> str:
    fs, inner = filesystem(path)
    with fs.open_input_stream(inner) as handle:
        return handle.read().decode("utf-8")


def exists(path: str) -> bool:
    fs, inner = filesystem(path)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


__all__ = ["exists", "filesystem", "join", "read_text", "write_atomically", "write_text"]
