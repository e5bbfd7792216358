"""Loading checkpoint tensors into a model: all or nothing, with a report.

Every parameter/buffer of the model must come from the checkpoint with the same shape, unless its name starts
with one of ``expected_fresh_prefixes`` (a fresh finetune head on a pretrained encoder): those keep their current
values and are reported as "initialised fresh". Every checkpoint key the model does not use must belong to a known
group (pretraining heads, second encoder copy, bond-output branches, ...) and is reported with that group's reason.
Anything else — a missing key, a shape mismatch, an unexplained extra key — raises before any tensor is copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
from torch import nn

from kermt.checkpoint.keys import OTHER_GROUP, group_of
from kermt.errors import UserError


class CheckpointMismatchError(UserError):
    """The checkpoint does not fit the model (missing key, shape mismatch or unexplained key)."""


@dataclass(frozen=True)
class LoadReport:
    """What a load did. ``ignored``: reason -> keys; ``ignored_entries``: non-weight entries (optimizer, ...)."""

    used: tuple[str, ...]
    fresh: tuple[str, ...] = ()
    ignored: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ignored_entries: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "used": len(self.used),
            "initialised_fresh": list(self.fresh),
            "ignored": {reason: len(keys) for reason, keys in self.ignored.items()},
            "ignored_entries": dict(self.ignored_entries),
        }

    def summary(self) -> str:
        lines = [f"loaded {len(self.used)} tensors"]
        if self.fresh:
            lines.append(f"initialised fresh: {len(self.fresh)} tensors ({_prefix_summary(self.fresh)})")
        lines += [f"ignored {len(keys)} tensors: {reason}" for reason, keys in self.ignored.items()]
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.ignored_entries.items():
            by_reason.setdefault(reason, []).append(name)
        lines += [f"ignored entries {', '.join(names)}: {reason}" for reason, names in by_reason.items()]
        return "\n".join(lines)


def _prefix_summary(keys: Iterable[str]) -> str:
    return ", ".join(sorted({k.split(".")[0] for k in keys}))


def plan_load(target: dict[str, torch.Tensor], source: dict[str, torch.Tensor],
              expected_fresh_prefixes: tuple[str, ...] = ()) -> LoadReport:
    """Check ``source`` (canonical checkpoint keys) against ``target`` (a model's state dict); no copying."""
    errors: list[str] = []
    used, fresh = [], []
    for key, tensor in target.items():
        if key in source:
            if tuple(source[key].shape) != tuple(tensor.shape):
                errors.append(f"shape mismatch for {key!r}: checkpoint {tuple(source[key].shape)}, "
                              f"model {tuple(tensor.shape)}")
            used.append(key)
        elif expected_fresh_prefixes and key.startswith(expected_fresh_prefixes):
            fresh.append(key)
        else:
            errors.append(f"missing key {key!r} (model shape {tuple(tensor.shape)}) in the checkpoint")
    ignored: dict[str, list[str]] = {}
    for key in source:
        if key in target:
            continue
        group = group_of(key)
        if group is OTHER_GROUP:
            errors.append(f"unexpected key {key!r} in the checkpoint: the model has no such tensor")
        else:
            ignored.setdefault(group.unused_reason, []).append(key)
    if errors:
        shown = "\n  ".join(errors[:20]) + (f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else "")
        raise CheckpointMismatchError(f"checkpoint does not fit the model ({len(errors)} problems):\n  {shown}")
    return LoadReport(tuple(used), tuple(fresh), {r: tuple(k) for r, k in ignored.items()})


def load_into_model(model: nn.Module, source: dict[str, torch.Tensor],
                    expected_fresh_prefixes: tuple[str, ...] = (),
                    ignored_entries: dict[str, str] | None = None) -> LoadReport:
    """Copy checkpoint tensors into ``model`` after :func:`plan_load` accepted them; returns the report.

    Parameters shared by several names (upstream reuses one PReLU module across the layers of an FFN) must hold
    equal values in the checkpoint, otherwise loading would silently keep only one of them.
    """
    target = model.state_dict()
    report = plan_load(target, source, expected_fresh_prefixes)
    _check_tied_values(target, source)
    full = {key: source[key] if key in source else tensor for key, tensor in target.items()}
    model.load_state_dict(full, strict=True)
    if ignored_entries:
        report = LoadReport(report.used, report.fresh, report.ignored, dict(ignored_entries))
    return report


def tied_groups(state_dict: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names that share one storage (same data pointer, shape and strides), each group in state-dict order."""
    by_identity: dict[tuple, list[str]] = {}
    for key, tensor in state_dict.items():
        if tensor.numel() == 0:
            continue
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                    tensor.stride(), tensor.dtype)
        by_identity.setdefault(identity, []).append(key)
    return [keys for keys in by_identity.values() if len(keys) > 1]


def _check_tied_values(target: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
    for keys in tied_groups(target):
        present = [k for k in keys if k in source]
        first = present[0] if present else None
        for other in present[1:]:
            if not torch.equal(source[first], source[other]):
                raise CheckpointMismatchError(
                    f"{first!r} and {other!r} are one shared parameter in the model but differ in the checkpoint"
                )
