"""Export a finetuned model to upstream KERMT's ``model.pt`` layout, for upstream ``main.py predict``.

Upstream behaviour: docs/upstream-compatibility.md#export.

``{'args': Namespace, 'state_dict': OrderedDict, 'data_scaler': {'means','stds'} | None, 'features_scaler': ...}``.

Upstream's finetune model always builds the encoder's four output branches; ours builds only the two atom-output
branches it uses. The bond-output branch tensors are taken from ``passthrough`` (kept from the source checkpoint
when the model came from one, see :mod:`kermt.checkpoint.native`); otherwise they are written as zeros and a
warning is returned. They do not influence finetune predictions (upstream's finetune forward never reads them), but
upstream's ``fingerprint --fingerprint_source bond|both`` on such an export would be meaningless.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kermt.checkpoint.keys import ATOM_BRANCH_PREFIXES, bond_branch_key
from kermt.checkpoint.spec import CheckpointSpec
from kermt.data.scalers import StandardScaler
from kermt.errors import UserError
from kermt.presets import UPSTREAM_FINETUNE

class UnfaithfulExportError(UserError):
    """The model cannot be written in upstream's layout without changing what it predicts."""


# Keys our model has that upstream's KermtFinetuneTask does not (upstream keeps MTL weights in the loss, unsaved).
_NOT_UPSTREAM = ("mtl_log_sigma",)

# Non-architecture args upstream's predict/load path reads; values are its finetune parser defaults (the training
# ones from the UPSTREAM_FINETUNE preset, the rest switches `kermt finetune` does not offer).
_UPSTREAM_DEFAULTS: dict[str, Any] = {
    "parser_name": "finetune", "backbone": "gtrans", "cuda": False, "dense": False, "features_only": False,
    "features_dim": 0, "features_path": None, "fingerprint": False, "no_cache": True,
    "select_by_loss": False, "distinct_init": False, "use_compound_names": False, "use_input_features": None,
    "gpu": None, "task_wise_checkpoint": False, **dataclasses.asdict(UPSTREAM_FINETUNE.training),
}


def upstream_args(spec: CheckpointSpec, overrides: dict[str, Any] | None = None) -> argparse.Namespace:
    """The Namespace upstream's load_checkpoint / build_model / make_predictions need for this model."""
    encoder, readout, head = spec.encoder, spec.readout, spec.head
    assert readout is not None and head is not None
    args = dict(_UPSTREAM_DEFAULTS)
    args.update(
        hidden_size=encoder.hidden_size, depth=encoder.depth, num_attn_head=encoder.num_attn_head,
        num_mt_block=encoder.num_mt_block, activation=encoder.activation, bias=encoder.bias,
        undirected=encoder.undirected, dropout=encoder.dropout, embedding_output_type="both",
        self_attention=readout.self_attention, attn_hidden=readout.attn_hidden, attn_out=readout.attn_out,
        ffn_hidden_size=head.ffn_hidden_size, ffn_num_layers=head.ffn_num_layers,
        ffn_num_task_specific_layers=head.ffn_num_task_specific_layers,
        ffn_task_specific_hidden_size=head.ffn_task_specific_hidden_size,
        features_size=head.features_size, num_tasks=head.num_tasks, output_size=head.num_tasks,
        dataset_type=head.dataset_type, use_mtl_loss=spec.use_mtl_loss,
        task_names=list(spec.task_names) if spec.task_names else [f"task_{i}" for i in range(head.num_tasks)],
        features_generator=list(spec.features.features_generator) or None,
        features_scaling=spec.features.features_scaling,
        rdkit2D_normalization_type=spec.features.rdkit2D_normalization_type or "fast",
        use_cuikmolmaker_featurization=spec.features.use_cuikmolmaker_featurization,
        standardize=spec.features.standardize,  # ours: upstream ignores it; kermt reads it back
    )
    args.update(overrides or {})
    return argparse.Namespace(**args)


def upstream_state_dict(state_dict: dict[str, torch.Tensor], spec: CheckpointSpec,
                        passthrough: dict[str, torch.Tensor] | None = None) -> tuple[OrderedDict, list[str]]:
    """Our finetune state dict completed to upstream's key set; returns (state dict, warnings)."""
    passthrough = passthrough or {}
    warnings: list[str] = []
    result = OrderedDict((k, t.detach().cpu()) for k, t in state_dict.items() if k not in _NOT_UPSTREAM)
    if any(k in state_dict for k in _NOT_UPSTREAM):
        warnings.append("mtl_log_sigma is not part of upstream's model state and was not exported")
    bond_input = spec.encoder.hidden_size + spec.encoder.bond_fdim  # W_1 of a bond branch reads [hidden | f_bonds]
    zeroed = []
    for key in [k for k in state_dict if k.startswith(ATOM_BRANCH_PREFIXES)]:
        bond_key = bond_branch_key(key)
        if bond_key in passthrough:
            result[bond_key] = passthrough[bond_key].detach().cpu()
            continue
        shape = list(state_dict[key].shape)
        if key.endswith("W_1.weight"):
            shape[1] = bond_input
        result[bond_key] = torch.zeros(shape, dtype=state_dict[key].dtype)
        zeroed.append(bond_key)
    if zeroed:
        warnings.append(f"{len(zeroed)} encoder bond-output branch tensors were not available and were written as "
                        "zeros (unused by upstream finetune predictions; upstream bond/both fingerprints of this "
                        "file would be meaningless)")
    return result, warnings


def _scaler_entry(scaler: StandardScaler | None) -> dict[str, np.ndarray] | None:
    if scaler is None:
        return None
    return {"means": np.asarray(scaler.means, dtype=np.float64), "stds": np.asarray(scaler.stds, dtype=np.float64)}


def export_upstream(path: str | Path, state_dict: dict[str, torch.Tensor], spec: CheckpointSpec, *,
                    passthrough: dict[str, torch.Tensor] | None = None,
                    args_overrides: dict[str, Any] | None = None) -> list[str]:
    """Write an upstream-compatible ``model.pt`` atomically; returns warnings (also worth logging)."""
    if spec.kind != "finetuned":
        raise ValueError(f"only finetuned models can be exported to upstream's model.pt layout, not {spec.kind}")
    if spec.encoder.padding != "upstream":
        # Upstream has one numerics: its padding row takes part in every neighbour sum. Weights trained with it
        # kept at zero would give different predictions there, and no upstream arg can express it.
        raise UnfaithfulExportError(
            f"{path}: cannot export a model trained with padding={spec.encoder.padding!r} to upstream's model.pt: "
            "upstream always sums its padding row, so it would predict differently with these weights; use the "
            "native checkpoint with kermt, or train with padding='upstream' for an upstream-compatible file"
        )
    if spec.head is not None and spec.head.variance:
        raise UnfaithfulExportError(
            f"{path}: cannot export a model with a variance head (--loss mve) to upstream's model.pt: upstream's "
            "heads predict one value per task; use the native checkpoint with kermt")
    if spec.head is not None and spec.head.features_ffn:
        raise UnfaithfulExportError(
            f"{path}: cannot export a model with a features FFN (features_ffn) to upstream's model.pt: upstream's "
            "heads have no such layers; use the native checkpoint with kermt, or train with --no-features_ffn")
    upstream_sd, warnings = upstream_state_dict(state_dict, spec, passthrough)
    state = {
        "args": upstream_args(spec, args_overrides),
        "state_dict": upstream_sd,
        "data_scaler": _scaler_entry(spec.data_scaler),
        "features_scaler": _scaler_entry(spec.features_scaler),
    }
    save_torch_file(state, path)
    return warnings


def save_torch_file(state: dict[str, Any], path: str | Path) -> Path:
    """``torch.save`` to a hidden sibling, then renamed onto ``path``: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    torch.save(state, staging)
    os.replace(staging, path)
    return path


__all__ = ["UnfaithfulExportError", "export_upstream", "save_torch_file", "upstream_args", "upstream_state_dict"]
