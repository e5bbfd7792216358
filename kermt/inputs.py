"""Checks of files the user names, made before reading them, so a wrong file is a clear :class:`UserError`.

A checkpoint is an upstream ``.pt`` (torch's zip format, or its legacy format, which starts with a pickle) or a
native checkpoint directory. Any other file (a CSV, an ``.npz``, a truncated download) would otherwise fail deep
inside torch's unpickler with an error that names neither the file nor the problem.
"""

from __future__ import annotations

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


__all__ = ["check_checkpoint_file"]
