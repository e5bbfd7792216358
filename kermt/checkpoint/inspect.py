"""A JSON-ready description of a checkpoint (what ``kermt inspect`` prints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kermt.checkpoint.keys import group_counts
from kermt.checkpoint.loader import CheckpointMismatchError, tied_groups
from kermt.checkpoint.reader import Checkpoint, load_finetune_model, read_checkpoint


def unique_parameter_count(state_dict: dict[str, torch.Tensor]) -> int:
    """Elements over distinct storages: tied names (shared PReLU slopes, a hybrid's second encoder copy) count once."""
    aliases = {alias for group in tied_groups(state_dict) for alias in group[1:]}
    duplicates = _equal_copies(state_dict, aliases)
    return sum(t.numel() for k, t in state_dict.items() if k not in aliases and k not in duplicates)


def _equal_copies(state_dict: dict[str, torch.Tensor], aliases: set[str]) -> set[str]:
    """``latent_dist.kermt.*`` names whose values equal ``kermt.*`` but were saved unshared (e.g. after conversion)."""
    copies = set()
    for key, tensor in state_dict.items():
        if key.startswith("latent_dist.kermt.") and key not in aliases:
            original = state_dict.get(key[len("latent_dist."):])
            if original is not None and original.shape == tensor.shape and torch.equal(original, tensor):
                copies.add(key)
    return copies


def _training_summary(training_state: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, value in training_state.items():
        if isinstance(value, (int, float, str)) or value is None:
            summary[name] = value
        elif isinstance(value, dict):
            summary[name] = f"<{name} state: {', '.join(sorted(map(str, value)))}>"
        else:
            summary[name] = f"<{type(value).__name__}>"
    return summary


def _load_check(checkpoint: Checkpoint) -> dict[str, Any]:
    """Try rebuilding the finetuned model and loading every tensor; report the outcome."""
    try:
        _, report = load_finetune_model(checkpoint)
    except (CheckpointMismatchError, ValueError) as error:
        return {"ok": False, "error": str(error)}
    return {"ok": True, **report.to_dict()}


def inspect_checkpoint(checkpoint: Checkpoint, *, load_check: bool = True) -> dict[str, Any]:
    """Kind, architecture, tasks, scalers, features, key groups, parameter count, notes and load check.

    ``parameters`` counts elements of distinct tensors (buffers such as ``cached_zero_vector`` included).
    """
    spec = checkpoint.spec
    info = spec.to_dict()
    report: dict[str, Any] = {
        "path": str(checkpoint.path),
        "format": checkpoint.format,
        "kind": spec.kind,
        "architecture": {"encoder": info["encoder"], "readout": info["readout"], "head": info["head"]},
        "tasks": {
            "task_names": info["task_names"],
            "num_tasks": spec.head.num_tasks if spec.head else None,
            "dataset_type": spec.head.dataset_type if spec.head else None,
        },
        "scalers": {"data_scaler": info["data_scaler"], "features_scaler": info["features_scaler"]},
        "features": info["features"],
        "pretrain": info["pretrain"],
        "key_groups": group_counts(list(checkpoint.state_dict), checkpoint.state_dict),
        "tensors": len(checkpoint.state_dict),
        "parameters": unique_parameter_count(checkpoint.state_dict),
        "training_state": _training_summary(checkpoint.training_state),
        "provenance": checkpoint.provenance,
        "warnings": info["notes"],
    }
    if spec.kind == "finetuned" and load_check:
        report["load_check"] = _load_check(checkpoint)
    return report


def inspect_path(path: str | Path, *, trust_pickle: bool = False, load_check: bool = True) -> dict[str, Any]:
    return inspect_checkpoint(read_checkpoint(path, trust_pickle=trust_pickle), load_check=load_check)


__all__ = ["inspect_checkpoint", "inspect_path", "unique_parameter_count"]
