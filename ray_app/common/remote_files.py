"""Inputs and outputs given as URIs (``s3://``, ``gs://``, any pyarrow filesystem URI).

The library reads and writes local files, so a subcommand's URIs are resolved at its edge, on the driver:

- an input file or directory (data, features, split files, checkpoints) is downloaded once into a cache keyed by
  its URI and its size and modification time (``$KERMT_CACHE``, default ``~/.cache/kermt``), so re-running a
  command does not download it again while a changed object is fetched anew;
- an output directory (``--save_dir``) is mirrored: its current contents are downloaded first, into a new local
  directory (so that an interrupted run resumes and finished models are kept, from what the URI holds, never from
  files an earlier run left on this disk), the run works in the mirror, and everything is uploaded when the command
  ends, also when it fails (a failed upload is then a note on the run's own error), so a re-run can pick up where
  it stopped;
- an output file (``--output_path``) is written to a private staging directory and uploaded when the command
  succeeded, so no half-written result ever appears at the URI.

A URI that cannot be read is a one-line error naming the flag and the URI. ``hf://`` URIs (models on the Hugging
Face Hub, the released NV-KERMT-70M-v2 among them) are fetched by ``ray_app/common/release.py``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kermt.errors import UserError, first_line
from ray_app.common.cache import cache_root
from ray_app.common.release import HUB_SCHEME, fetch_from_hub, fetch_release
from ray_app.common.storage import is_uri

# Settings that name files or directories to read, and those that name outputs (every subcommand's schema uses
# these names; a schema without one of them simply skips it).
INPUT_SETTINGS = (
    "data_path", "separate_val_path", "separate_test_path", "features_path", "separate_val_features_path",
    "separate_test_features_path", "checkpoint_path", "checkpoint_dir", "folds_file", "crossval_index_dir",
    "crossval_index_file", "continue_from", "atom_vocab_path", "bond_vocab_path", "smiles_vocab_path",
    "calibration_path", "calibration_features_path",
)
OUTPUT_DIR_SETTINGS = ("save_dir",)
OUTPUT_FILE_SETTINGS = ("output_path",)


def _filesystem(uri: str, flag: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as error:  # ArrowInvalid for an unknown scheme, OSError for bad endpoint options
        raise UserError(f"{flag} {uri}: not a URI this machine can open ({first_line(error)})") from None


def _info(filesystem: Any, path: str, uri: str, flag: str) -> Any:
    try:
        return filesystem.get_file_info(path)
    except Exception as error:
        raise UserError(f"{flag} {uri} cannot be read ({first_line(error)}); check the URI, the credentials "
                        "(e.g. AWS_* variables) and the endpoint") from None


def fetch_input(uri: str, flag: str) -> str:
    """A local copy of the file or directory at ``uri`` (a local path is returned unchanged)."""
    import pyarrow.fs as pafs

    if not is_uri(uri):
        return uri
    if uri.startswith(HUB_SCHEME):
        return fetch_from_hub(uri, flag)
    filesystem, path = _filesystem(uri, flag)
    info = _info(filesystem, path, uri, flag)
    if info.type == pafs.FileType.NotFound:
        raise UserError(f"{flag} {uri}: no such object or prefix; check the URI")
    stamp = f"{uri}|{info.size}|{info.mtime_ns}".encode()
    target = cache_root() / "inputs" / hashlib.sha256(stamp).hexdigest()[:24] / (Path(path).name or "input")
    if target.exists():
        return str(target)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=_ensure(target.parent)))
    try:
        local = staging / target.name
        if info.type == pafs.FileType.Directory:
            local.mkdir()
        pafs.copy_files(path, str(local), source_filesystem=filesystem, destination_filesystem=pafs.LocalFileSystem())
        os.replace(local, target)  # whole or not at all: a killed download leaves only the staging directory
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def _ensure(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def mirror_directory(uri: str, flag: str) -> Path:
    """A new local directory holding what is at ``uri`` now (empty for a new prefix).

    Each command gets its own: the URI is the truth, so files an earlier run left on this disk (its mirror kept
    after a failed upload, a killed process) are neither resumed from nor uploaded again."""
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(uri, flag)
    info = _info(filesystem, path, uri, flag)
    if info.type == pafs.FileType.File:
        raise UserError(f"{flag} {uri} is a file; give a directory (prefix)")
    key = hashlib.sha256(uri.encode()).hexdigest()[:24]
    local = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=_ensure(cache_root() / "mirrors")))
    if info.type == pafs.FileType.Directory:
        pafs.copy_files(path, str(local), source_filesystem=filesystem,
                        destination_filesystem=pafs.LocalFileSystem())
    return local


def upload(local: Path, uri: str, flag: str) -> None:
    """Copy a local file, or a directory's whole tree, to ``uri``."""
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(uri, flag)
    try:
        pafs.copy_files(str(local), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=filesystem)
    except Exception as error:
        raise UserError(f"{flag} {uri}: the upload failed ({first_line(error)}); the results are kept in "
                        f"{local}") from None


def _localized_inputs(config: BaseModel, keep_remote: Sequence[str]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if getattr(config, "pretrained_release", False):  # the released model, fetched before Ray starts like any input
        changes.update(checkpoint_path=str(fetch_release(getattr(config, "model_dir", None))),
                       pretrained_release=False)
    for name in (n for n in INPUT_SETTINGS if n not in keep_remote):
        value = getattr(config, name, None)
        if isinstance(value, str) and is_uri(value):
            changes[name] = fetch_input(value, f"--{name}")
        elif isinstance(value, Sequence) and not isinstance(value, str) and any(is_uri(v) for v in value):
            changes[name] = [fetch_input(v, f"--{name}") for v in value]
    return changes


@contextmanager
def local_files(config: BaseModel, keep_remote: Sequence[str] = ()) -> Iterator[Any]:
    """``config`` with every URI setting replaced by a local path; outputs are uploaded on exit (see the module
    docstring for when). ``keep_remote``: input settings the command reads from URIs itself (screening streams
    ``--data_path`` with Ray Data)."""
    changes = _localized_inputs(config, keep_remote)
    mirrors = _uri_settings(config, OUTPUT_DIR_SETTINGS)
    staged = _uri_settings(config, OUTPUT_FILE_SETTINGS)
    staging = Path(tempfile.mkdtemp(prefix="kermt-out-")) if staged else None
    downloaded: dict[str, set[str]] = {}  # each mirror's files as downloaded: what the run removes is removed there
    try:
        for name, uri in mirrors.items():
            changes[name] = str(mirror_directory(uri, f"--{name}"))
            downloaded[name] = _files_under(Path(changes[name]))
        for name, uri in staged.items():
            _filesystem(uri, f"--{name}")  # an unusable URI fails now, not after the whole run
            changes[name] = str(staging / name / Path(uri.split("?", 1)[0]).name)
            Path(changes[name]).parent.mkdir(parents=True)
    except BaseException:
        _remove([staging, *(Path(changes[name]) for name in mirrors if name in changes)])
        raise
    try:
        yield config.model_copy(update=changes) if changes else config
    except BaseException as error:  # the run's error is the story; a failed upload of its mirror is a note on it
        for failure in _upload_all(mirrors, changes, downloaded).values():
            print(failure, file=sys.stderr, flush=True)
            error.add_note(str(failure))
        _remove([staging])  # half-written outputs of a failed run are never uploaded
        raise
    failures = _upload_all({**mirrors, **staged}, changes, downloaded)
    if not any(name in staged for name in failures):
        _remove([staging])
    if failures:  # the first, with the others noted; what was not uploaded stays on disk (each message says where)
        first, *others = failures.values()
        for other in others:
            first.add_note(str(other))
        raise first


def _uri_settings(config: BaseModel, names: Sequence[str]) -> dict[str, str]:
    return {name: getattr(config, name) for name in names
            if isinstance(getattr(config, name, None), str) and is_uri(getattr(config, name))}


def _upload_all(outputs: dict[str, str], changes: dict[str, Any],
                downloaded: dict[str, set[str]]) -> dict[str, UserError]:
    """Upload every local output to its URI; the failures by setting, each naming the local copy that is kept. A
    mirror that was uploaded is removed: the next command starts from what the URI holds (:func:`mirror_directory`).
    Files the run removed from a mirror (an earlier run moved aside, ``--overwrite``) are deleted at the URI, after
    the upload, so nothing is ever only in neither place."""
    failures = {}
    for name, uri in outputs.items():
        try:
            upload(Path(changes[name]), uri, f"--{name}")
            if name in downloaded:
                _delete_at(uri, downloaded[name] - _files_under(Path(changes[name])), f"--{name}")
        except UserError as failure:
            failures[name] = failure
            continue
        print(f"--{name}: uploaded {changes[name]} to {uri}", flush=True)
        if name in OUTPUT_DIR_SETTINGS:
            _remove([Path(changes[name])])
    return failures


def _files_under(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def _delete_at(uri: str, relative_paths: set[str], flag: str) -> None:
    """Delete these files under the directory ``uri``; only files the mirror brought down are ever named, so what
    other processes wrote there meanwhile (Tune's storage under the same prefix) is never touched."""
    if not relative_paths:
        return
    filesystem, path = _filesystem(uri, flag)
    try:
        for relative in sorted(relative_paths):
            filesystem.delete_file(f"{path.rstrip('/')}/{relative}")
    except Exception as error:
        raise UserError(f"{flag} {uri}: deleting the files this run removed from it failed ({first_line(error)}); "
                        "some of them are still there") from None


def publish(local_file: Path, directory_uri: str, flag: str) -> None:
    """Upload one file of a mirrored directory now rather than when the command ends: what a re-run needs even if
    this driver is killed (a run's id, which names its Tune experiment in the run's storage)."""
    from kermt.data import atomic_files  # pyarrow: not on the path of `--help`

    upload(local_file, atomic_files.join(directory_uri, local_file.name), flag)


def _remove(directories: Sequence[Path | None]) -> None:
    for directory in directories:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def with_absolute_paths(config: BaseModel) -> BaseModel:
    """``config`` with every local path setting made absolute (URIs stay as they are), so that the config.yaml and
    run.json a run writes replay from any directory, and a re-run from elsewhere is not taken for the same run."""
    updates: dict[str, Any] = {}
    for name in (*INPUT_SETTINGS, *OUTPUT_DIR_SETTINGS, *OUTPUT_FILE_SETTINGS):
        value = getattr(config, name, None)
        if isinstance(value, str):
            updates[name] = _absolute(value)
        elif isinstance(value, list):
            updates[name] = [_absolute(v) for v in value]
    return config.model_copy(update=updates)


def _absolute(path: str) -> str:
    return path if is_uri(path) else os.path.abspath(os.path.expanduser(path))  # the user's symlinks kept


__all__ = ["fetch_input", "local_files", "mirror_directory", "publish", "upload", "with_absolute_paths"]
