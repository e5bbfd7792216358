"""Finding and reading the members of a finetune output: every member's best model, each a finetuned checkpoint."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from kermt.checkpoint import Checkpoint, read_checkpoint
from kermt.checkpoint.spec import CheckpointSpec
from kermt.errors import UserError

SKIPPED_FILES = ("last_checkpoint.pt", "training_state.pt")  # resumable training state, not a best model

def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]

def find_checkpoints(checkpoint_dir: str | Path) -> list[Path]:
    """Every member's best model under ``checkpoint_dir``, in natural order (fold_2 before fold_10).

    A native checkpoint directory is a member. A ``.pt`` file is a member unless it sits next to a native
    directory (``kermt finetune`` writes ``model_m/model/`` and its export ``model_m/model.pt``: one member, read
    natively) or is resumable training state. Hidden entries (atomic-write staging) are skipped.
    """
    from kermt.checkpoint import is_native_checkpoint

    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise UserError(f"--checkpoint_dir {root} is not a directory" + ("" if root.exists() else " (it does not "
                        "exist)") + "; pass the directory a finetune run saved to, or --checkpoint_path for one model")
    found: list[Path] = []
    for directory, subdirs, files in os.walk(root):
        here = Path(directory)
        subdirs[:] = _visible_after_recovery(here, subdirs)
        native = [here / d for d in subdirs if is_native_checkpoint(here / d)]
        found += native
        subdirs[:] = [d for d in subdirs if here / d not in native]
        if not native:
            found += [here / f for f in files if f.endswith(".pt") and f not in SKIPPED_FILES
                      and not f.startswith(".")]
    if not found:
        raise UserError(f"--checkpoint_dir {root}: no checkpoint under it (looked for native model directories and "
                        ".pt files); pass the --save_dir of a finished finetune run")
    return sorted(found, key=_natural_key)

def _visible_after_recovery(here: Path, subdirs: list[str]) -> list[str]:
    """The visible subdirectories, with a native checkpoint an interrupted replacement left aside (``.X.old``
    without ``X``) moved back into place first."""
    from kermt.checkpoint.native import recover_native

    parked = [d[1:-len(".old")] for d in subdirs if d.startswith(".") and d.endswith(".old")]
    recovered = [name for name in parked if recover_native(here / name)]
    return [d for d in subdirs if not d.startswith(".")] + recovered

def read_members(paths: Sequence[str | Path], trust_pickle: bool = False,
                 dataset_type: str | None = None) -> list[Checkpoint]:
    """Read every member; each must be a finetuned checkpoint. ``dataset_type``: the user's, for a file that stores
    neither its dataset type nor a ``data_scaler`` entry (see :func:`kermt.checkpoint.read_checkpoint`)."""
    members = [read_checkpoint(p, trust_pickle=trust_pickle, dataset_type=dataset_type) for p in paths]
    for member in members:
        if member.spec.kind != "finetuned":
            raise UserError(f"{member.path} is a {member.spec.kind} (pretraining) checkpoint: it has no prediction "
                             "head; use `kermt fingerprint` or `kermt embed` for its embeddings")
    return members

def task_names(spec: CheckpointSpec) -> tuple[str, ...]:
    return spec.task_names or tuple(f"task_{i}" for i in range(spec.head.num_tasks))
