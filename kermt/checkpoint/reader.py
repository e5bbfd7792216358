"""One entry point for any checkpoint (upstream ``.pt`` or native directory) and for loading it into models."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from kermt.checkpoint.keys import BOND_BRANCH_PREFIXES, READOUT_PREFIX, TASK_HEAD_PREFIXES
from kermt.checkpoint.loader import CheckpointMismatchError, LoadReport, load_into_model
from kermt.checkpoint.native import is_native_checkpoint, load_native, save_native
from kermt.checkpoint.spec import CheckpointSpec
from kermt.checkpoint.upstream import read_upstream_checkpoint
from kermt.errors import UserError
from kermt.registry import PRETRAIN_MODES

# Parameters a finetune model gets fresh when its encoder comes from a pretraining checkpoint.
FRESH_HEAD_PREFIXES = (READOUT_PREFIX, *TASK_HEAD_PREFIXES, "mtl_log_sigma")
# Upstream never saves MTL weights (they live in its loss module), so they are fresh even from a finetuned file.
FRESH_FROM_UPSTREAM_FINETUNED = ("mtl_log_sigma",)

_TRAINING_ENTRY_REASON = "training state of the source run (optimizer/scheduler/progress); not model weights"


@dataclass
class Checkpoint:
    """A checkpoint in memory. ``state_dict``: canonical keys. ``passthrough``: tensors kept only for export."""

    path: Path
    format: Literal["upstream", "native"]
    spec: CheckpointSpec
    state_dict: dict[str, torch.Tensor]
    passthrough: dict[str, torch.Tensor] = field(default_factory=dict)
    training_state: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def ignored_entries(self) -> dict[str, str]:
        return {name: _TRAINING_ENTRY_REASON for name in self.training_state}


def read_checkpoint(path: str | Path, *, trust_pickle: bool = False, dataset_type: str | None = None) -> Checkpoint:
    """Read an upstream ``.pt`` file (safely unless ``trust_pickle``) or a native checkpoint directory.

    ``dataset_type``: the user's, needed only for an upstream finetuned file that stores neither its dataset_type
    nor a ``data_scaler`` entry (native checkpoints always store it)."""
    path = Path(path)
    if is_native_checkpoint(path):
        native = load_native(path)
        return Checkpoint(path, "native", native.spec, native.state_dict, native.passthrough,
                          provenance=native.provenance)
    if path.is_dir():
        raise UserError(f"{path} is a directory but not a native kermt checkpoint (no config.json + "
                        "model.safetensors); pass the .pt file itself for upstream checkpoints")
    upstream = read_upstream_checkpoint(path, trust_pickle=trust_pickle, dataset_type=dataset_type)
    provenance = {"source_format": "upstream-pt", "source_file": path.name, "source_sha256": upstream.sha256}
    return Checkpoint(path, "upstream", upstream.spec, upstream.state_dict,
                      training_state=upstream.training_state, provenance=provenance)


def load_finetune_model(checkpoint: Checkpoint) -> tuple[nn.Module, LoadReport]:
    """Rebuild the finetuned model a checkpoint holds and load every tensor (strict; see :mod:`loader`)."""
    from kermt.nn.finetune import KermtFinetuneModel  # kermt.nn is heavier; import on use

    model = KermtFinetuneModel(checkpoint.spec.finetune_model_config())
    fresh = FRESH_FROM_UPSTREAM_FINETUNED if checkpoint.format == "upstream" else ()
    return model, _load(model, checkpoint, fresh)


def load_pretrain_model(checkpoint: Checkpoint) -> tuple[nn.Module, LoadReport]:
    """Rebuild a vocab/cmim/hybrid pretraining model (e.g. to resume pretraining) and load it strictly."""
    import dataclasses

    from kermt.nn.pretrain.config import PretrainHeadsConfig
    from kermt.nn.pretrain.model import KermtPretrainModel

    if checkpoint.spec.kind not in PRETRAIN_MODES:
        raise UserError(f"{checkpoint.path} is a {checkpoint.spec.kind} checkpoint, not a pretraining one; pass a "
                        "vocab, cmim or hybrid pretraining checkpoint")
    names = {f.name for f in dataclasses.fields(PretrainHeadsConfig)}
    settings = {k: v for k, v in checkpoint.spec.pretrain.items() if k in names}
    settings["pretrain_mode"] = checkpoint.spec.kind  # the tensors decide, whatever args.pretrain_mode said
    model = KermtPretrainModel(checkpoint.spec.encoder, PretrainHeadsConfig(**settings))
    return model, _load(model, checkpoint, ())


def load_pretrained_weights(model: nn.Module, checkpoint: Checkpoint,
                            expected_fresh_prefixes: tuple[str, ...] = FRESH_HEAD_PREFIXES) -> LoadReport:
    """Load a pretrained encoder into a finetune model whose head is new (reported as initialised fresh)."""
    return _load(model, checkpoint, expected_fresh_prefixes)


def _load(model: nn.Module, checkpoint: Checkpoint, fresh: tuple[str, ...]) -> LoadReport:
    """:func:`load_into_model`; a checkpoint that does not fit names its file."""
    try:
        return load_into_model(model, checkpoint.state_dict, fresh, checkpoint.ignored_entries())
    except CheckpointMismatchError as error:
        raise CheckpointMismatchError(f"{checkpoint.path}: {error}\nThe file's tensors do not match the model it "
                                      "describes: use the checkpoint as it was saved") from error


def unbuilt_encoder_tensors(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """Encoder bond-output branch tensors a finetune model does not build (kept for an exact upstream export)."""
    found = {k: t for k, t in checkpoint.state_dict.items() if k.startswith(BOND_BRANCH_PREFIXES)}
    return found or dict(checkpoint.passthrough)


def convert_to_native(checkpoint: Checkpoint, directory: str | Path) -> Path:
    """Save a finetuned checkpoint as a native directory (weights exactly as our model holds them)."""
    model, _ = load_finetune_model(checkpoint)
    return save_native(directory, model.state_dict(), checkpoint.spec,
                       passthrough=unbuilt_encoder_tensors(checkpoint), provenance=checkpoint.provenance)


__all__ = [
    "Checkpoint", "FRESH_HEAD_PREFIXES", "convert_to_native", "load_finetune_model", "load_pretrain_model",
    "load_pretrained_weights",
    "read_checkpoint", "unbuilt_encoder_tensors",
]
