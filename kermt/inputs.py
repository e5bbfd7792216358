"""Checks of files the user names, made before reading or writing them, so a wrong path is a clear
:class:`UserError`.

A checkpoint is an upstream ``.pt`` (torch's zip format, or its legacy format, which starts with a pickle) or a
native checkpoint directory. Any other file (a CSV, an ``.npz``, a truncated download) would otherwise fail deep
inside torch's unpickler with an error that names neither the file nor the problem.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

from kermt.errors import UserError

PICKLE_PROTOCOL_OPCODE = b"\x80"
ZIP_MAGIC = b"PK\x03\x04"


def check_checkpoint_file(path: str | Path, flag: str = "checkpoint") -> None:
    """Raise a UserError unless ``path`` exists and is a directory or looks like a torch checkpoint file."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{flag} {path} does not exist")
    if path.is_dir():
        return  # the native reader says what a checkpoint directory lacks
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(PICKLE_PROTOCOL_OPCODE):
        return
    if head == ZIP_MAGIC and _is_torch_zip(path):
        return
    raise UserError(f"{flag} {path} is not a checkpoint (expected a torch .pt file or a native checkpoint "
                    "directory with config.json and model.safetensors)")


def _is_torch_zip(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("data.pkl") for name in archive.namelist())
    except zipfile.BadZipFile:
        return False


WRITABLE_ADVICE = "give a path in a folder you can write to"


def check_output_path(path: str | Path, flag: str, *, directory: bool = False, advice: str = WRITABLE_ADVICE) -> None:
    """Raise a UserError unless the folder ``path`` is written in (``directory``: ``path`` itself, else its parent)
    exists or can be created, and takes a new file. Tried for real (create, write, remove), because permission bits
    do not say it for root, a read-only mount or ``/proc``; what the try created is removed again."""
    target = Path(path).expanduser()
    folder = target if directory else target.parent
    if directory and target.exists() and not target.is_dir():
        raise UserError(f"{flag} {path} is a file; give a directory")
    existing = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    if existing.exists() and not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, so the folder {folder} cannot be made")
    created = [p for p in (folder, *folder.parents) if p.is_relative_to(existing) and p != existing]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _remove_folders(created)
        raise UserError(f"{flag} {path}: cannot create the folder {folder} ({error.strerror or error}); "
                        f"{advice}") from None
    try:
        handle, probe = tempfile.mkstemp(prefix=".kermt-write-check-", dir=folder)
        os.close(handle)
        os.remove(probe)
    except OSError as error:
        raise UserError(f"{flag} {path}: cannot write in {folder} ({error.strerror or error}); {advice}") \
            from None
    finally:
        _remove_folders(created)


def _remove_folders(folders: list[Path]) -> None:
    """Remove these folders, deepest first, where they are still empty (what a check created, nothing else)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


__all__ = ["check_checkpoint_file", "check_output_path"]
