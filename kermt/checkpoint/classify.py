"""Kind and architecture of a checkpoint, from its saved ``args`` checked against its tensor shapes.

Shape-determined values (hidden size, heads, blocks, bias, PReLU, readout and FFN shapes, features_size, tasks)
come from the tensors; a saved arg that contradicts them is an error (the file is inconsistent). Values the weights
cannot show (depth, undirected, dataset_type, ...) come from ``args``; when ``args`` lacks them (legacy GROVER
files) a default is used and a note says so.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from kermt.checkpoint.keys import (
    ATOM_BRANCH_PREFIXES,
    BOND_BRANCH_PREFIXES,
    DECODER_PREFIX,
    ENCODER_PREFIX,
    LATENT_HEAD_PREFIX,
    TASK_HEAD_PREFIXES,
    VOCAB_HEAD_PREFIXES,
)
from kermt.checkpoint.spec import CheckpointKind, CheckpointSpec, FeatureSettings
from kermt.chem.standardize import UNRECORDED_STANDARDIZATION
from kermt.config import EncoderConfig, HeadConfig, ReadoutConfig
from kermt.data.scalers import StandardScaler
from kermt.errors import UserError
from kermt.presets import UPSTREAM_FINETUNE

_BLOCK = "kermt.encoders.node_blocks."
_FFN = "mol_atom_from_atom_ffn."
_TASK_SPECIFIC = "mol_atom_from_atom_ffn_task_specific."
_PRETRAIN_ARGS = (
    "pretrain_mode", "decoder_num_layers", "decoder_num_attention_heads", "decoder_ffn_hidden_size",
    "decoder_dropout", "decoder_max_seq_len", "decoder_positional_encoding", "decoder_gate_self_attn",
    "decoder_gate_cross_attn", "contrastive_temperature", "vocab_loss_weight", "reconstruction_loss_weight",
)


class _Resolver:
    """Reconciles shape-derived values with saved args and collects notes."""

    def __init__(self, args: dict[str, Any], source: str) -> None:
        self.args = args
        self.source = source
        self.notes: list[str] = []

    def from_shape(self, name: str, value: Any) -> Any:
        saved = self.args.get(name)
        if saved is not None and saved != value:
            raise UserError(f"{self.source}: saved args say {name}={saved!r} but the tensors imply {value!r}; the "
                            "file is inconsistent (edited or damaged): use the checkpoint as it was saved")
        if name not in self.args:
            self.notes.append(f"{name}={value!r} inferred from tensor shapes (not in saved args)")
        return value

    def from_args(self, name: str, default: Any) -> Any:
        if self.args.get(name) is not None:
            return self.args[name]
        self.notes.append(f"{name} not stored in the checkpoint; using default {default!r}")
        return default


def classify_kind(keys: list[str], source: str = "checkpoint") -> CheckpointKind:
    """grover_base (encoder only) | vocab | cmim | hybrid | finetuned, from canonical key prefixes."""
    def has(*prefixes: str) -> bool:
        return any(k.startswith(prefixes) for k in keys)

    if not has(ENCODER_PREFIX):
        raise UserError(f"{source}: no encoder keys (kermt.*, grover.* or latent_dist.kermt.*): not a KERMT/GROVER "
                        "checkpoint; pass a model saved by KERMT, GROVER or kermt")
    if has(*TASK_HEAD_PREFIXES):
        return "finetuned"
    vocab = has(*VOCAB_HEAD_PREFIXES)
    latent = has(LATENT_HEAD_PREFIX, DECODER_PREFIX)
    if vocab and latent:
        return "hybrid"
    return "cmim" if latent else "vocab" if vocab else "grover_base"


def describe_checkpoint(args: dict[str, Any], state_dict: dict[str, torch.Tensor], raw: dict[str, Any],
                        source: str, dataset_type: str | None = None) -> CheckpointSpec:
    """Build the :class:`CheckpointSpec` of an upstream checkpoint (``state_dict`` with canonical keys).

    ``dataset_type``: the caller's (the user's ``--dataset_type``), used when the file does not store one.
    """
    kind = classify_kind(list(state_dict), source)
    resolve = _Resolver(args, source)
    encoder = _encoder(state_dict, resolve)
    readout = head = None
    if kind == "finetuned":
        readout = _readout(state_dict, resolve)
        task_type = _dataset_type(resolve, raw, dataset_type)
        head = _head(state_dict, resolve, readout.output_size(encoder.hidden_size), encoder, task_type)
    generator = args.get("features_generator") or ()
    features = FeatureSettings(
        features_generator=tuple(generator),
        features_scaling=bool(args.get("features_scaling", True)),
        rdkit2D_normalization_type=args.get("rdkit2D_normalization_type"),
        use_cuikmolmaker_featurization=bool(args.get("use_cuikmolmaker_featurization", False)),
        standardize=args.get("standardize", UNRECORDED_STANDARDIZATION),  # exported by kermt; upstream's: none
    )
    task_names = args.get("task_names")
    return CheckpointSpec(
        kind=kind, encoder=encoder, readout=readout, head=head,
        use_mtl_loss=bool(args.get("use_mtl_loss", False)),
        task_names=tuple(task_names) if task_names is not None else None,
        features=features if kind == "finetuned" else FeatureSettings(),
        data_scaler=StandardScaler.from_dict(raw.get("data_scaler")),
        features_scaler=StandardScaler.from_dict(raw.get("features_scaler")),
        pretrain=_pretrain_settings(state_dict, args, kind) if kind != "finetuned" else {},
        notes=tuple(resolve.notes),
    )


def _indices(keys: list[str], prefix: str) -> list[int]:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    return sorted({int(m.group(1)) for k in keys if (m := pattern.match(k))})


def _encoder(sd: dict[str, torch.Tensor], resolve: _Resolver) -> EncoderConfig:
    keys = list(sd)
    node_w_i = sd[f"{_BLOCK}0.W_i.weight"]
    edge_w_i = sd["kermt.encoders.edge_blocks.0.W_i.weight"]
    prelu = f"{_BLOCK}0.act_func.weight" in sd
    saved_activation = resolve.args.get("activation")
    if saved_activation is not None and (saved_activation == "PReLU") != prelu:
        raise UserError(f"{resolve.source}: saved activation {saved_activation!r} contradicts the tensors "
                         f"({'has' if prelu else 'no'} PReLU slopes)")
    # no slopes and no saved name: upstream finetune's default activation (its pretraining's, PReLU, has slopes)
    activation = "PReLU" if prelu else resolve.from_args("activation", UPSTREAM_FINETUNE.encoder.activation)
    if prelu and saved_activation is None:
        resolve.notes.append("activation='PReLU' inferred from the PReLU slope tensors")
    if resolve.args.get("undirected"):
        raise UserError(f"{resolve.source}: saved args say undirected=True, which upstream KERMT cannot run (its node "
                         "blocks index atom messages with reverse-bond indices) and kermt refuses; this checkpoint "
                         "was not trained by a working upstream model")
    return EncoderConfig(
        hidden_size=resolve.from_shape("hidden_size", node_w_i.shape[0]),
        depth=resolve.from_args("depth", EncoderConfig.depth),
        num_attn_head=resolve.from_shape("num_attn_head", len(_indices(keys, f"{_BLOCK}0.heads."))),
        num_mt_block=resolve.from_shape("num_mt_block", len(_indices(keys, _BLOCK))),
        activation=activation,
        bias=resolve.from_shape("bias", f"{_BLOCK}0.W_i.bias" in sd),
        undirected=resolve.from_args("undirected", False),
        dropout=resolve.args.get("dropout") or 0.0,
        embedding_output_type=_output_type(keys, resolve),
        atom_fdim=node_w_i.shape[1],
        bond_fdim=edge_w_i.shape[1],
    )


def _output_type(keys: list[str], resolve: _Resolver) -> str:
    atom = any(k.startswith(ATOM_BRANCH_PREFIXES) for k in keys)
    bond = any(k.startswith(BOND_BRANCH_PREFIXES) for k in keys)
    built = "both" if atom and bond else "atom" if atom else "bond"
    saved = resolve.args.get("embedding_output_type")
    if saved is None:
        resolve.notes.append(f"embedding_output_type={built!r} inferred from the output branches present")
        return built
    if built != "both" and saved != built:  # upstream builds all four branches whatever the type, so "both" fits any
        raise UserError(f"{resolve.source}: saved embedding_output_type={saved!r} but only {built} branches exist; "
                        "the file is inconsistent (edited or damaged)")
    return saved


def _linear_shapes(sd: dict[str, torch.Tensor], prefix: str) -> list[tuple[int, int]]:
    """(in, out) of every nn.Linear directly under ``prefix`` (a Sequential), in layer order."""
    layers = [i for i in _indices(list(sd), prefix) if sd.get(f"{prefix}{i}.weight", torch.empty(0)).ndim == 2]
    return [(sd[f"{prefix}{i}.weight"].shape[1], sd[f"{prefix}{i}.weight"].shape[0]) for i in layers]


def _readout(sd: dict[str, torch.Tensor], resolve: _Resolver) -> ReadoutConfig:
    if "readout.attn.w1" not in sd:
        resolve.from_shape("self_attention", False)
        return ReadoutConfig(self_attention=False, attn_hidden=resolve.args.get("attn_hidden", 4),
                             attn_out=resolve.args.get("attn_out", 8))
    return ReadoutConfig(
        self_attention=resolve.from_shape("self_attention", True),
        attn_hidden=resolve.from_shape("attn_hidden", sd["readout.attn.w1"].shape[0]),
        attn_out=resolve.from_shape("attn_out", sd["readout.attn.w2"].shape[0]),
    )


def _dataset_type(resolve: _Resolver, raw: dict[str, Any], given: str | None) -> str:
    """Saved args, else the caller's value, else what the file shows: upstream stores target statistics
    (``data_scaler``) for regression and None for classification. A file with neither is an error, not a guess."""
    saved = resolve.args.get("dataset_type")
    if saved is not None:
        if given is not None and given != saved:
            raise UserError(f"{resolve.source}: the checkpoint was trained as {saved} but dataset_type={given!r} "
                            "was asked for; drop --dataset_type (the checkpoint decides it)")
        return saved
    if given is not None:
        resolve.notes.append(f"dataset_type={given!r} given (not stored in the checkpoint)")
        return given
    if "data_scaler" in raw:
        inferred = "regression" if raw["data_scaler"] is not None else "classification"
        resolve.notes.append(f"dataset_type={inferred!r} inferred: the file stores "
                             f"{'target statistics' if inferred == 'regression' else 'no target statistics'} "
                             "(upstream stores them for regression only)")
        return inferred
    raise UserError(f"{resolve.source}: a finetuned checkpoint with no saved dataset_type and no data_scaler entry: "
                     "cannot tell regression from classification; pass --dataset_type regression|classification")


def _head(sd: dict[str, torch.Tensor], resolve: _Resolver, readout_size: int, encoder: EncoderConfig,
          dataset_type: str) -> HeadConfig:
    shared = _linear_shapes(sd, _FFN)
    tasks = _indices(list(sd), _TASK_SPECIFIC)
    task_layers = _linear_shapes(sd, f"{_TASK_SPECIFIC}0.") if tasks else []
    ffn_hidden = shared[0][1] if len(shared) > 1 else resolve.args.get("ffn_hidden_size")
    return HeadConfig(
        num_tasks=resolve.from_shape("num_tasks", len(tasks) if tasks else shared[-1][1]),
        dataset_type=dataset_type,
        features_size=resolve.from_shape("features_size", shared[0][0] - readout_size),
        ffn_hidden_size=resolve.from_shape("ffn_hidden_size", ffn_hidden) if len(shared) > 1 else ffn_hidden,
        ffn_num_layers=resolve.from_shape("ffn_num_layers", len(shared)),
        ffn_num_task_specific_layers=resolve.from_shape("ffn_num_task_specific_layers", len(task_layers)),
        ffn_task_specific_hidden_size=(
            resolve.from_shape("ffn_task_specific_hidden_size", shared[-1][1]) if tasks
            else resolve.args.get("ffn_task_specific_hidden_size")
        ),
        dropout=resolve.args.get("dropout") or 0.0,
        activation=encoder.activation,
    )


def _pretrain_settings(sd: dict[str, torch.Tensor], args: dict[str, Any], kind: str) -> dict[str, Any]:
    """Pretraining-only settings: saved args (decoder ones only when a decoder exists) plus head sizes."""
    names = _PRETRAIN_ARGS if kind in ("cmim", "hybrid") else ("pretrain_mode",)
    settings = {name: args[name] for name in names if name in args}
    shapes = {
        "atom_vocab_size": ("vocab_module.av_task_atom.linear.weight", "av_task_atom.linear.weight"),
        "bond_vocab_size": ("vocab_module.bv_task_atom.linear.weight", "bv_task_atom.linear.weight"),
        "fg_size": ("vocab_module.fg_task_all.linear_atom_from_atom.weight",
                    "fg_task_all.linear_atom_from_atom.weight"),
        "smiles_vocab_size": ("decoder.token_embedding.weight",),
    }
    for name, candidates in shapes.items():
        found = [sd[key].shape[0] for key in candidates if key in sd]
        if found:
            settings[name] = int(found[0])
    if "latent_dist.fc_mean_logscale.weight" in sd:
        settings["latent_dim"] = int(sd["latent_dist.fc_mean_logscale.weight"].shape[0] // 2)
    return settings
