"""Native checkpoint format: a directory with ``model.safetensors`` + ``config.json``.

* ``model.safetensors``: the model's state dict. safetensors refuses tensors that share storage, and upstream's
  models share some (one PReLU module reused across an FFN's layers; a hybrid model's encoder under two names).
  Each storage is written once under its first name; ``config.json["tied"]`` maps every other name to it, and
  loading hands back the same tensor object under both names (loading into the model restores the tie anyway,
  because the model itself shares the module).
* ``passthrough.safetensors`` (optional): tensors of the source checkpoint that this model does not build (the
  encoder's bond-output branches of a finetune model). They are never loaded into a model; they exist so an export
  back to upstream's ``.pt`` layout is complete and exact.
* ``config.json``: format name/version, the :class:`CheckpointSpec` (kind, architecture, tasks, dataset_type,
  scalers, feature settings) and provenance (e.g. the source file's sha256).

Writes are atomic: everything goes to a temporary directory next to the target, which is then renamed into place.
Replacing an existing checkpoint renames the old one aside (``.<name>.old``), renames the new one in, then deletes
the old one, so at every instant one of the two is a complete checkpoint. A crash between the two renames leaves
only the aside copy: every reader (and the next write) moves it back first (:func:`recover_native`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from kermt.checkpoint.loader import tied_groups
from kermt.checkpoint.spec import CheckpointSpec
from kermt.errors import UserError

FORMAT_NAME = "kermt-native"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PASSTHROUGH_FILE = "passthrough.safetensors"


@dataclass
class NativeCheckpoint:
    """A loaded native checkpoint. ``state_dict`` keys are the model's; tied names share one tensor."""

    path: Path
    spec: CheckpointSpec
    state_dict: dict[str, torch.Tensor]
    passthrough: dict[str, torch.Tensor] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)


def is_native_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a native checkpoint directory (after recovering an interrupted replacement of it)."""
    path = Path(path)
    recover_native(path)
    return _is_complete(path)


def _is_complete(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


def aside_path(directory: Path) -> Path:
    """Where a replacement parks the previous checkpoint until the new one is in place."""
    return directory.parent / f".{directory.name}.old"


def recover_native(directory: str | Path) -> bool:
    """Move the previous checkpoint back if a replacement of ``directory`` stopped between its two renames (the
    target is missing, its aside copy complete). Returns whether it did."""
    directory = Path(directory)
    aside = aside_path(directory)
    if directory.exists() or not _is_complete(aside):
        return False
    try:
        os.replace(aside, directory)
    except FileNotFoundError:  # another reader recovered it first
        return _is_complete(directory)
    return True


def _untie(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """One tensor per storage (contiguous CPU copies) plus alias -> kept-name map."""
    aliases = {alias: group[0] for group in tied_groups(state_dict) for alias in group[1:]}
    unique = {k: t.detach().cpu().contiguous().clone() for k, t in state_dict.items() if k not in aliases}
    return unique, aliases


def save_native(directory: str | Path, state_dict: dict[str, torch.Tensor], spec: CheckpointSpec, *,
                passthrough: dict[str, torch.Tensor] | None = None,
                provenance: dict[str, Any] | None = None) -> Path:
    """Write a native checkpoint directory atomically (replacing an existing one); returns its path."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    weights, tied = _untie(state_dict)
    config = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **spec.to_dict(),
        "tied": tied,
        "passthrough": sorted(passthrough) if passthrough else [],
        "provenance": dict(provenance or {}),
    }
    staging = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        save_file(weights, str(staging / WEIGHTS_FILE), metadata={"format": FORMAT_NAME})
        if passthrough:
            save_file(_untie(passthrough)[0], str(staging / PASSTHROUGH_FILE), metadata={"format": FORMAT_NAME})
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")
        _replace_directory(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _replace_directory(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``: the old target is renamed aside, the new one renamed in, the old one deleted.

    Never is there neither: a crash between the renames leaves the aside copy, which :func:`recover_native` moves
    back; a crash after them leaves a stale aside copy next to the new target, deleted by the next write.
    """
    recover_native(target)
    aside = aside_path(target)
    if aside.exists():
        shutil.rmtree(aside)  # stale: the target it was the previous version of is complete
    if target.exists():
        os.replace(target, aside)
    os.replace(staging, target)
    shutil.rmtree(aside, ignore_errors=True)


def load_native(directory: str | Path) -> NativeCheckpoint:
    """Read a native checkpoint directory (no pickle involved)."""
    directory = Path(directory)
    if not is_native_checkpoint(directory):
        raise UserError(f"{directory} is not a native kermt checkpoint (needs {CONFIG_FILE} and {WEIGHTS_FILE}); "
                        "pass a model directory written by kermt, or an upstream .pt file")
    config = _read_config(directory / CONFIG_FILE)
    if config.get("format") != FORMAT_NAME:
        raise UserError(f"{directory / CONFIG_FILE}: format {config.get('format')!r}, expected {FORMAT_NAME!r}; "
                        "this directory was not written by kermt")
    if config.get("format_version", 0) > FORMAT_VERSION:
        raise UserError(f"{directory}: format version {config['format_version']} is newer than this kermt "
                        f"understands ({FORMAT_VERSION}); upgrade kermt")
    weights = _read_tensors(directory / WEIGHTS_FILE)
    tied: dict[str, str] = config.pop("tied", {})
    state_dict = _with_aliases(weights, tied, directory)
    passthrough_names = config.pop("passthrough", [])
    passthrough = _read_tensors(directory / PASSTHROUGH_FILE) if passthrough_names else {}
    provenance = config.pop("provenance", {})
    for key in ("format", "format_version"):
        config.pop(key)
    return NativeCheckpoint(directory, CheckpointSpec.from_dict(config), state_dict, passthrough, provenance)


def saved_spec(directory: str | Path) -> CheckpointSpec:
    """The spec of the native checkpoint ``directory``, read from its config.json alone (no weights)."""
    config = _read_config(Path(directory) / CONFIG_FILE)
    for key in ("format", "format_version", "tied", "passthrough", "provenance"):
        config.pop(key, None)
    return CheckpointSpec.from_dict(config)


def saved_run_id(directory: str | Path) -> str | None:
    """The id of the run that saved the native checkpoint ``directory`` (its provenance), None without one."""
    provenance = _read_config(Path(directory) / CONFIG_FILE).get("provenance", {})
    return provenance.get("run_id") if isinstance(provenance, dict) else None


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(
            f"{path}: cannot read it as JSON ({error}); the checkpoint is damaged: copy it again") from error
    if not isinstance(config, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(config).__name__}; the checkpoint is damaged")
    return config


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"{path} is missing; the native checkpoint is incomplete: copy the whole directory again")
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise UserError(f"{path}: cannot read it as safetensors ({error}); the file is truncated or corrupt: copy "
                        "the checkpoint again") from error


def _with_aliases(weights: dict[str, torch.Tensor], tied: dict[str, str], directory: Path) -> dict[str, torch.Tensor]:
    """Re-insert every tied name as the very tensor object of the name it is tied to."""
    missing = sorted(target for target in tied.values() if target not in weights)
    if missing:
        raise UserError(f"{directory}: the native checkpoint ties names to tensors it does not hold: {missing[:3]}; "
                        "the checkpoint is damaged")
    state_dict = dict(weights)
    for alias, target in tied.items():
        state_dict[alias] = weights[target]
    return state_dict


__all__ = ["NativeCheckpoint", "is_native_checkpoint", "load_native", "save_native", "saved_run_id", "saved_spec"]
