"""Inputs and outputs given as URIs (``s3://``, ``gs://``, any pyarrow filesystem URI).

The library reads and writes local files, so a subcommand's URIs are resolved at its edge, on the driver:

- an input file or directory (data, features, split files, checkpoints) is downloaded once into a cache keyed by
  its URI and its size and modification time (``$KERMT_CACHE``, default ``~/.cache/kermt``), so re-running a
  command does not download it again while a changed object is fetched anew;
- an output directory (``--save_dir``) is mirrored: its current contents are downloaded first (so that an
  interrupted run resumes and finished models are kept), the run works in the mirror, and everything is uploaded
  when the command ends, also when it fails, so a re-run can pick up where it stopped;
- an output file (``--output_path``) is written to a private staging directory and uploaded when the command
  succeeded, so no half-written result ever appears at the URI.

A URI that cannot be read is a one-line error naming the flag and the URI. ``hf://`` URIs (models on the Hugging
Face Hub, the released NV-KERMT-70M-v2 among them) are fetched by ``ray_app/common/release.py``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kermt.errors import UserError
from ray_app.common.storage import is_uri

# Settings that name files or directories to read, and those that name outputs (every subcommand's schema uses
# these names; a schema without one of them simply skips it).
INPUT_SETTINGS = (
    "data_path", "separate_val_path", "separate_test_path", "features_path", "separate_val_features_path",
    "separate_test_features_path", "checkpoint_path", "checkpoint_dir", "folds_file", "crossval_index_dir",
    "crossval_index_file", "continue_from", "atom_vocab_path", "bond_vocab_path", "smiles_vocab_path",
)
OUTPUT_DIR_SETTINGS = ("save_dir",)
OUTPUT_FILE_SETTINGS = ("output_path",)


def cache_root() -> Path:
    return Path(os.environ.get("KERMT_CACHE", Path.home() / ".cache" / "kermt"))


def _filesystem(uri: str, flag: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as error:  # ArrowInvalid for an unknown scheme, OSError for bad endpoint options
        raise UserError(f"{flag} {uri}: not a URI this machine can open ({_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _info(filesystem: Any, path: str, uri: str, flag: str) -> Any:
    try:
        return filesystem.get_file_info(path)
    except Exception as error:
        raise UserError(f"{flag} {uri} cannot be read ({_first_line(error)}); check the URI, the credentials "
                        "(e.g. AWS_* variables) and the endpoint") from None


def fetch_input(uri: str, flag: str) -> str:
    """A local copy of the file or directory at ``uri`` (a local path is returned unchanged)."""
    import pyarrow.fs as pafs

    if not is_uri(uri):
        return uri
    from ray_app.common.release import HUB_SCHEME, fetch_from_hub

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
    """A local directory holding what is at ``uri`` now (empty for a new prefix)."""
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(uri, flag)
    local = _ensure(cache_root() / "mirrors" / hashlib.sha256(uri.encode()).hexdigest()[:24])
    info = _info(filesystem, path, uri, flag)
    if info.type == pafs.FileType.File:
        raise UserError(f"{flag} {uri} is a file; give a directory (prefix)")
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
        raise UserError(f"{flag} {uri}: the upload failed ({_first_line(error)}); the results are kept in "
                        f"{local}") from None


def _localized_inputs(config: BaseModel, keep_remote: Sequence[str]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if getattr(config, "pretrained_release", False):  # the released model, fetched before Ray starts like any input
        from ray_app.common.release import fetch_release

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
    mirrors = {name: getattr(config, name) for name in OUTPUT_DIR_SETTINGS
               if isinstance(getattr(config, name, None), str) and is_uri(getattr(config, name))}
    staged = {name: getattr(config, name) for name in OUTPUT_FILE_SETTINGS
              if isinstance(getattr(config, name, None), str) and is_uri(getattr(config, name))}
    for name, uri in mirrors.items():
        changes[name] = str(mirror_directory(uri, f"--{name}"))
    staging = Path(tempfile.mkdtemp(prefix="kermt-out-")) if staged else None
    for name, uri in staged.items():
        _filesystem(uri, f"--{name}")  # an unusable URI fails now, not after the whole run
        changes[name] = str(staging / name / Path(uri.split("?", 1)[0]).name)  # type: ignore[operator]
        Path(changes[name]).parent.mkdir(parents=True)
    succeeded = False
    try:
        yield config.model_copy(update=changes) if changes else config
        succeeded = True
    finally:
        for name, uri in mirrors.items():
            upload(Path(changes[name]), uri, f"--{name}")
            print(f"--{name}: uploaded {changes[name]} to {uri}", flush=True)
        if succeeded:
            for name, uri in staged.items():
                upload(Path(changes[name]), uri, f"--{name}")
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


__all__ = ["cache_root", "fetch_input", "local_files", "mirror_directory", "upload"]
