"""Model config = checkpoint architecture + the user's training settings; contradictions are errors.

Differences from upstream (docs/upstream-compatibility.md#loading-and-the-args-rule): upstream's ``load_checkpoint``
copies about thirty saved args over the command line, among them training settings (dropout, dist_coff, bond_drop_rate,
weight_decay, self_attention, attn_hidden, ffn sizes, ensemble_size), so finetuning from a pretrain checkpoint silently
ignores ``--self_attention --dropout 0 --dist_coff 0.15 --bond_drop_rate 0.1``. Here:

* architecture (hidden_size, depth, num_attn_head, num_mt_block, activation, bias, undirected, feature widths; and
  for a finetuned checkpoint the readout/head shape, features_size, num_tasks, dataset_type) comes from the
  checkpoint; a user value that differs is an :class:`ArchitectureConflictError` naming both values;
* everything else (dropout, padding mode, and the whole readout/head of a fresh head on a pretrained encoder) is
  the user's, never the checkpoint's. Loss/optimizer settings (dist_coff, bond_drop_rate, weight_decay) are not
  model config at all and are never read from a checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from kermt.checkpoint.spec import CheckpointSpec
from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.errors import UserError

ENCODER_ARCHITECTURE = ("hidden_size", "depth", "num_attn_head", "num_mt_block", "activation", "bias", "undirected",
                        "atom_fdim", "bond_fdim")
READOUT_ARCHITECTURE = ("self_attention", "attn_hidden", "attn_out")
HEAD_ARCHITECTURE = ("num_tasks", "dataset_type", "features_size", "ffn_hidden_size", "ffn_num_layers",
                     "ffn_num_task_specific_layers", "ffn_task_specific_hidden_size", "activation", "features_ffn")


class ArchitectureConflictError(UserError):
    """A user setting contradicts the architecture stored in the checkpoint."""


def _conflicts(section: str, fields: tuple[str, ...], stored: Any, user: Mapping[str, Any]) -> list[str]:
    problems = []
    for name in fields:
        if name in user and user[name] is not None and user[name] != getattr(stored, name):
            problems.append(f"{section}.{name}: you set {user[name]!r} but the checkpoint was trained with "
                            f"{getattr(stored, name)!r}")
    return problems


def _raise_if(problems: list[str], source: str) -> None:
    if problems:
        raise ArchitectureConflictError(
            f"settings contradict the architecture of checkpoint {source}:\n  " + "\n  ".join(problems)
            + "\nRemove these settings (the checkpoint decides the architecture) or use a matching checkpoint."
        )


def _user_fields(cls: type, user: Mapping[str, Any], section: str) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(user) - names)
    if unknown:
        raise ValueError(f"unknown {section} setting(s) {unknown}; valid: {sorted(names)}")
    return {k: v for k, v in user.items() if v is not None}


def merge_encoder(stored: EncoderConfig, user: Mapping[str, Any], source: str = "") -> EncoderConfig:
    """Checkpoint encoder architecture with the user's non-architecture settings (dropout, padding, output type)."""
    settings = _user_fields(EncoderConfig, user, "encoder")
    _raise_if(_conflicts("encoder", ENCODER_ARCHITECTURE, stored, settings), source)
    training = {k: v for k, v in settings.items() if k not in ENCODER_ARCHITECTURE}
    # a finetune keeps the checkpoint's padding: its weights were trained with it
    defaults = {"dropout": EncoderConfig.dropout, "padding": stored.padding,
                "embedding_output_type": stored.embedding_output_type}
    return dataclasses.replace(stored, **{**defaults, **training})


def merge_finetune_config(spec: CheckpointSpec, *, encoder: Mapping[str, Any] | None = None,
                          readout: Mapping[str, Any] | None = None, head: Mapping[str, Any] | None = None,
                          use_mtl_loss: bool | None = None, source: str = "") -> FinetuneModelConfig:
    """Finetune model config from a checkpoint plus the settings the user gave explicitly (None = not given).

    Pretrained encoder (grover_base/vocab/cmim/hybrid): readout and head are entirely the user's (``head`` needs
    num_tasks and dataset_type). Finetuned checkpoint: their shape must match; dropout stays the user's.
    """
    encoder, readout, head = dict(encoder or {}), dict(readout or {}), dict(head or {})
    merged_encoder = merge_encoder(spec.encoder, encoder, source)
    head.setdefault("activation", merged_encoder.activation)
    if spec.kind != "finetuned":
        readout_config = ReadoutConfig(**_user_fields(ReadoutConfig, readout, "readout"))
        head_config = HeadConfig(**_user_fields(HeadConfig, head, "head"))
        mtl = bool(use_mtl_loss)
    else:
        assert spec.readout is not None and spec.head is not None
        readout_settings = _user_fields(ReadoutConfig, readout, "readout")
        head_settings = _user_fields(HeadConfig, head, "head")
        problems = _conflicts("readout", READOUT_ARCHITECTURE, spec.readout, readout_settings)
        problems += _conflicts("head", HEAD_ARCHITECTURE, spec.head, head_settings)
        _raise_if(problems, source)
        readout_config = spec.readout
        head_config = dataclasses.replace(spec.head, dropout=head_settings.get("dropout", HeadConfig.dropout))
        mtl = spec.use_mtl_loss if use_mtl_loss is None else use_mtl_loss
    return FinetuneModelConfig(merged_encoder, readout_config, head_config, mtl)


__all__ = ["ArchitectureConflictError", "merge_encoder", "merge_finetune_config"]
