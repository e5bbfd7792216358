"""Upstream KERMT / GROVER ``.pt`` checkpoints: read (safely), describe.

Layouts (docs/upstream-compatibility.md#checkpoint-formats): finetune ``model.pt`` = ``{args, state_dict, data_scaler,
features_scaler}``; ``last_checkpoint.pt`` adds ``epoch, optimizer, scheduler``; pretrain checkpoints add ``optimizer,
scheduler_step, batch_idx, epoch, wandb_run_id``. Legacy GROVER files may lack ``args``.
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kermt.checkpoint.classify import describe_checkpoint
from kermt.checkpoint.keys import canonical_state_dict
from kermt.checkpoint.safe_load import load_pickled_checkpoint
from kermt.checkpoint.spec import CheckpointSpec
from kermt.errors import UserError

MODEL_ENTRIES = ("args", "state_dict", "data_scaler", "features_scaler")
TRAINING_ENTRIES = ("optimizer", "scheduler", "epoch", "scheduler_step", "batch_idx", "wandb_run_id")


@dataclass
class UpstreamCheckpoint:
    """A parsed upstream checkpoint.

    ``state_dict``: canonical keys (legacy ``grover.`` renamed; see :mod:`kermt.checkpoint.keys`), CPU tensors.
    ``training_state``: optimizer / scheduler / epoch / step entries, present in resumable files only.
    """

    path: Path
    sha256: str
    args: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    spec: CheckpointSpec
    training_state: dict[str, Any] = field(default_factory=dict)
    other_entries: tuple[str, ...] = ()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_upstream_checkpoint(path: str | Path, *, trust_pickle: bool = False,
                             dataset_type: str | None = None) -> UpstreamCheckpoint:
    """Read and describe an upstream ``.pt`` file (safe loading unless ``trust_pickle``; see :mod:`safe_load`).

    ``dataset_type``: the user's, for a finetuned file that does not store it (see ``describe_checkpoint``)."""
    path = Path(path)
    raw = load_pickled_checkpoint(path, trust_pickle=trust_pickle)
    if "state_dict" not in raw:
        raise UserError(f"{path}: no 'state_dict' entry (found {sorted(raw)}); not an upstream KERMT checkpoint: "
                        "pass a model.pt saved by KERMT or GROVER")
    args = _args_dict(raw.get("args"), path)
    state_dict = canonical_state_dict({k: v for k, v in raw["state_dict"].items()})
    spec = describe_checkpoint(args, state_dict, raw, source=str(path), dataset_type=dataset_type)
    if not args:
        spec = _with_note(spec, "no saved args (legacy file): architecture inferred from tensor shapes")
    training = {k: raw[k] for k in TRAINING_ENTRIES if k in raw}
    others = tuple(sorted(set(raw) - set(MODEL_ENTRIES) - set(TRAINING_ENTRIES)))
    return UpstreamCheckpoint(path, file_sha256(path), args, state_dict, spec, training, others)


def _args_dict(args: Any, path: Path) -> dict[str, Any]:
    if args is None:
        return {}
    if isinstance(args, argparse.Namespace):
        return dict(vars(args))
    if isinstance(args, dict):
        return dict(args)
    raise UserError(f"{path}: 'args' is a {type(args).__name__}, expected an argparse.Namespace; the file was not "
                    "saved by KERMT or GROVER")


def _with_note(spec: CheckpointSpec, note: str) -> CheckpointSpec:
    from dataclasses import replace

    return replace(spec, notes=(note, *spec.notes))
