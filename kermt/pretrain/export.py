"""Saving a pretraining model: the native directory, and upstream's pretraining ``.pt`` layout.

Upstream's ``pretrain_ddp.py`` saves ``{args, state_dict, optimizer, scheduler_step, batch_idx, epoch,
data_scaler: None, features_scaler: None}``; its ``main.py finetune --checkpoint_path`` and our reader take the
``args`` and ``state_dict`` of such a file. :func:`export_pretrain_upstream` writes those entries (no optimizer: a
``model.pt`` is for finetuning and embedding; resuming uses the native training checkpoints).

A pretrained model directory is self-contained: :func:`save_model_vocabs` writes the vocabularies the model's heads
were trained with beside it, named as the released NV-KERMT-70M-v2 names its own (``pretrain_atom_vocab.json``,
...), so ``kermt reconstruct`` finds the SMILES vocab beside ``model.pt`` (or ``model/``) as it finds the
release's; :func:`save_corpus_record` names the corpus, for the novelty of generated molecules.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from kermt.checkpoint import CheckpointSpec, UnfaithfulExportError, save_native
from kermt.checkpoint.export import save_torch_file
from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.config import EncoderConfig
from kermt.data.atomic_files import write_text
from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig
from kermt.run_layout import CORPUS_RECORD_FILE, MODEL_VOCAB_FILES  # beside the model: the release's names

# pretrain_ddp.py defaults of the args that describe neither the architecture nor the losses.
_UPSTREAM_PRETRAIN_DEFAULTS: dict[str, Any] = {
    "backbone": "gtrans", "bond_drop_rate": 0, "self_attention": False, "attn_hidden": 4, "attn_out": 8,
    "undirected": False, "dense": False, "fine_tune_coff": 1, "no_cache": True, "cuda": False,
    "features_only": False, "features_dim": 0, "use_input_features": None,
}


def pretrain_spec(encoder: EncoderConfig, heads: PretrainHeadsConfig, loss: PretrainLossConfig) -> CheckpointSpec:
    """The spec a native pretraining checkpoint stores: kind = mode, every head and loss setting."""
    settings = {**dataclasses.asdict(heads), **dataclasses.asdict(loss)}
    return CheckpointSpec(kind=heads.pretrain_mode, encoder=encoder, pretrain=settings)


def save_pretrain_native(directory: str | Path, model: torch.nn.Module, loss: PretrainLossConfig,
                         provenance: dict[str, Any] | None = None) -> Path:
    """The (unwrapped) KermtPretrainModel as a native checkpoint directory, atomically."""
    spec = pretrain_spec(model.encoder_config, model.heads_config, loss)
    return save_native(directory, model.state_dict(), spec, provenance=provenance)


def upstream_pretrain_args(encoder: EncoderConfig, heads: PretrainHeadsConfig, loss: PretrainLossConfig,
                           extra: dict[str, Any] | None = None) -> argparse.Namespace:
    """The ``args`` Namespace of upstream's pretraining checkpoints for this model (pretrain_ddp.py flag names)."""
    args = dict(_UPSTREAM_PRETRAIN_DEFAULTS)
    args.update(
        parser_name="pretrain", hidden_size=encoder.hidden_size, depth=encoder.depth,
        num_attn_head=encoder.num_attn_head, num_mt_block=encoder.num_mt_block, activation=encoder.activation,
        bias=encoder.bias, dropout=encoder.dropout, embedding_output_type=encoder.embedding_output_type,
        **{k: v for k, v in dataclasses.asdict(heads).items() if k != "hybrid_single_encoder_pass"},
        **dataclasses.asdict(loss),
    )
    args.update(extra or {})
    return argparse.Namespace(**args)


def export_pretrain_upstream(path: str | Path, model: torch.nn.Module, loss: PretrainLossConfig,
                             progress: dict[str, int] | None = None, extra_args: dict[str, Any] | None = None) -> Path:
    """Write upstream's pretraining checkpoint layout for ``model`` (unwrapped) atomically. ``progress``:
    ``epoch``, ``batch_idx``, ``scheduler_step`` entries (upstream's names)."""
    encoder: EncoderConfig = model.encoder_config
    if encoder.padding != "upstream":
        raise UnfaithfulExportError(
            f"{path}: a model trained with padding={encoder.padding!r} cannot be written as upstream's .pt: upstream "
            "always sums its padding row and would compute other embeddings; use the native checkpoint")
    state = {
        "args": upstream_pretrain_args(encoder, model.heads_config, loss, extra_args),
        "state_dict": OrderedDict((k, v.detach().cpu()) for k, v in model.state_dict().items()),
        "data_scaler": None,
        "features_scaler": None,
        **(progress or {}),
    }
    return save_torch_file(state, path)


def save_model_vocabs(directory: str | Path, vocabs: dict[str, ContextVocab | SmilesVocab]) -> list[Path]:
    """Write {kind: vocab} (kinds of :data:`MODEL_VOCAB_FILES`) into ``directory``, each file atomically."""
    written = []
    for kind, vocab in vocabs.items():
        path = Path(directory) / MODEL_VOCAB_FILES[kind]
        write_text(str(path), json.dumps(vocab.to_dict()))
        written.append(path)
    return written


def save_corpus_record(directory: str | Path, corpus_path: str, n_molecules: int) -> Path:
    """``pretrain_corpus.json``: the corpus the model was pretrained on (local path or URI) and its size."""
    path = Path(directory) / CORPUS_RECORD_FILE
    write_text(str(path), json.dumps({"corpus": corpus_path, "n_molecules": n_molecules}, indent=1))
    return path


def places_beside(model_path: str | Path) -> list[Path]:
    """Where a model's files lie: beside a checkpoint file; inside a native checkpoint directory, else beside it."""
    path = Path(model_path)
    return [path, path.parent] if path.is_dir() else [path.parent]


def read_corpus_record(model_path: str | Path) -> str | None:
    """The corpus named beside a checkpoint (see :func:`places_beside`); None when none is."""
    for place in places_beside(model_path):
        record = place / CORPUS_RECORD_FILE
        if record.is_file():
            return json.loads(record.read_text())["corpus"]
    return None


__all__ = ["CORPUS_RECORD_FILE", "MODEL_VOCAB_FILES", "export_pretrain_upstream", "places_beside",
           "pretrain_spec", "read_corpus_record", "save_corpus_record", "save_model_vocabs", "save_pretrain_native",
           "upstream_pretrain_args"]
