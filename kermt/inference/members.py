"""Finding and reading the members of a finetune output: every member's best model, each a finetuned checkpoint."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from kermt.checkpoint import Checkpoint, read_checkpoint
from kermt.checkpoint.spec import CheckpointSpec
from kermt.errors import UserError
from kermt.run_layout import COMPLETE_MEMBER_FILE, RUN_RECORD_FILE, RUN_STATE_FILE, SWEEP_FILE

SKIPPED_FILES = ("last_checkpoint.pt", "training_state.pt")  # resumable training state, not a best model

def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]

def find_checkpoints(checkpoint_dir: str | Path) -> list[Path]:
    """Every member's best model under ``checkpoint_dir``, in natural order (fold_2 before fold_10).

    A directory a ``kermt finetune`` run owns (it holds :data:`RUN_STATE_FILE` and ``fold_k/``) has exactly its
    ``fold_k/model_m`` members, each saved by that run (:func:`run_members`); nothing else under it (Ray Tune's
    copies of the same models in ``ray_results/``, an earlier run in ``earlier_runs/``) is a member. Any other
    directory (upstream's save_dir, a folder of models) is searched: a native checkpoint directory is a member, and
    so is a ``.pt`` file unless it sits next to a native directory (``model_m/model/`` and its export
    ``model_m/model.pt`` are one member, read natively) or is resumable training state. Hidden entries
    (atomic-write staging) are skipped.
    """
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise UserError(f"--checkpoint_dir {root} is not a directory" + ("" if root.exists() else " (it does not "
                        "exist)") + "; pass the directory a finetune run saved to, or --checkpoint_path for one model")
    if (root / SWEEP_FILE).is_file():
        raise UserError(f"--checkpoint_dir {root} is a `kermt tune` sweep: its trials are candidates, not an "
                        f"ensemble; pass --checkpoint_path {root / 'best_model'} (the best trial), or finetune an "
                        f"ensemble with `kermt finetune --config {root / 'best_config.yaml'} --ensemble_size N`")
    found = run_members(root) if _is_finetune_run(root) else _searched_members(root)
    if not found:
        raise UserError(f"--checkpoint_dir {root}: no checkpoint under it (looked for native model directories and "
                        ".pt files); pass the --save_dir of a finished finetune run")
    return sorted(found, key=_natural_key)


def _is_finetune_run(root: Path) -> bool:
    return (root / RUN_STATE_FILE).is_file() and bool(_numbered(root, "fold"))  # a pretraining run has no folds


def run_members(root: Path) -> list[Path]:
    """The ``fold_k/model_m/model`` directories of the finetune run that owns ``root``. A member saved by another
    run (a stale leftover) or not completely written (an unfinished run) is an error, never averaged in."""
    from kermt.checkpoint.native import is_native_checkpoint, saved_run_id

    run_id = json.loads((root / RUN_STATE_FILE).read_text()).get("run_id")
    if finished_run_id(root) != run_id:
        raise UserError(f"--checkpoint_dir {root}: its run {run_id} has not finished (no {RUN_RECORD_FILE} of it "
                        "yet: it is still training, or was interrupted); re-run the same `kermt finetune` command to "
                        "finish it")
    members = [member for fold in _numbered(root, "fold") for member in _numbered(fold, "model")]
    for member in members:
        model = member / "model"
        if not is_native_checkpoint(model) or not (member / COMPLETE_MEMBER_FILE).is_file():
            raise UserError(f"--checkpoint_dir {root}: {member.relative_to(root)} is not completely written (the run "
                            "was interrupted or is still training); re-run the same `kermt finetune` command to "
                            "finish it")
        if saved_run_id(model) != run_id:
            raise UserError(f"--checkpoint_dir {root}: {member.relative_to(root)} was saved by run "
                            f"{saved_run_id(model)}, not by the run this directory holds ({run_id}, in "
                            f"{RUN_STATE_FILE}); remove it, or re-run `kermt finetune` on this directory")
    return [member / "model" for member in members]


def finished_run_id(root: Path) -> str | None:
    """The run id in ``run.json``'s summary, which a finetune writes once all its members are trained and scored."""
    try:
        record = json.loads((root / RUN_RECORD_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    summary = record.get("summary") if isinstance(record, dict) else None
    return summary.get("run_id") if isinstance(summary, dict) else None


def _numbered(parent: Path, prefix: str) -> list[Path]:
    return [p for p in parent.iterdir() if p.is_dir() and re.fullmatch(rf"{prefix}_\d+", p.name)]


def _searched_members(root: Path) -> list[Path]:
    from kermt.checkpoint import is_native_checkpoint

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
    return found

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
