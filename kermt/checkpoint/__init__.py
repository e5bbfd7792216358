"""Checkpoints: safe reading of upstream ``.pt`` files, description, strict loading, native format, export.

Typical use::

    ckpt = read_checkpoint("model.pt")            # upstream .pt (no code runs) or native directory
    model, report = load_finetune_model(ckpt)      # strict: every tensor accounted for
    print(report.summary())
    save_native("out/model", model.state_dict(), ckpt.spec, passthrough=unbuilt_encoder_tensors(ckpt))
    export_upstream("out/model.pt", model.state_dict(), ckpt.spec, passthrough=unbuilt_encoder_tensors(ckpt))
"""

from kermt.checkpoint.export import UnfaithfulExportError, export_upstream, upstream_args
from kermt.checkpoint.loader import CheckpointMismatchError, LoadReport, load_into_model, plan_load
from kermt.checkpoint.merge import ArchitectureConflictError, merge_encoder, merge_finetune_config
from kermt.checkpoint.native import is_native_checkpoint, load_native, save_native
from kermt.checkpoint.reader import (
    FRESH_HEAD_PREFIXES,
    Checkpoint,
    convert_to_native,
    load_finetune_model,
    load_pretrain_model,
    load_pretrained_weights,
    read_checkpoint,
    unbuilt_encoder_tensors,
)
from kermt.checkpoint.safe_load import UnsafeCheckpointError, load_pickled_checkpoint
from kermt.checkpoint.spec import CheckpointSpec, FeatureSettings

__all__ = [
    "ArchitectureConflictError", "Checkpoint", "CheckpointMismatchError", "CheckpointSpec", "FRESH_HEAD_PREFIXES",
    "FeatureSettings", "LoadReport", "UnsafeCheckpointError", "convert_to_native", "export_upstream",
    "is_native_checkpoint", "load_finetune_model", "load_into_model", "load_native", "load_pickled_checkpoint",
    "load_pretrain_model", "load_pretrained_weights", "merge_encoder", "merge_finetune_config", "plan_load",
    "read_checkpoint", "save_native", "UnfaithfulExportError", "unbuilt_encoder_tensors", "upstream_args",
]
