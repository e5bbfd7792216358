"""Typed configuration of the pretraining heads and losses (docs/upstream-compatibility.md#pretraining).

Field names reuse upstream's ``pretrain_ddp.py`` flag names, so an upstream checkpoint's saved ``args`` map onto
these dataclasses key for key. Defaults are upstream's (pretrain_mode vocab, as `kermt pretrain`), whose decoder is
the released NV-KERMT-70M-v2's (latent 512, 3 × 8-head RoPE decoder layers with FFN 2048, no gates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kermt.registry import (
    DEFAULT_PRETRAIN_MODE,
    POSITIONAL_ENCODINGS,
    PRETRAIN_MODES,
    PositionalEncoding,
    PretrainMode,
)

FG_SIZE = 85  # RDKit fragment counts used as functional-group labels (kermt.chem fgtasklabel)


@dataclass(frozen=True)
class PretrainHeadsConfig:
    """Architecture of everything a pretraining model adds on top of the encoder.

    ``pretrain_mode``: "vocab" (GROVER contextual-vocab + functional-group heads), "cmim" (latent head + SMILES
    decoder), or "hybrid" (both, sharing one encoder). Vocab sizes are required by the modes that use them:
    atom/bond for vocab and hybrid, smiles for cmim and hybrid.

    ``hybrid_single_encoder_pass``: upstream's hybrid forward runs the shared encoder twice (once for the vocab heads,
    once for the latent head), so in train mode the two paths see different depth and dropout draws. True runs it
    once and feeds both paths (half the encoder compute; eval-mode numbers are identical either way).
    """

    pretrain_mode: PretrainMode = DEFAULT_PRETRAIN_MODE
    atom_vocab_size: int | None = None
    bond_vocab_size: int | None = None
    smiles_vocab_size: int | None = None
    fg_size: int = FG_SIZE
    latent_dim: int = 512
    decoder_num_layers: int = 3
    decoder_num_attention_heads: int = 8
    decoder_ffn_hidden_size: int = 2048
    decoder_dropout: float = 0.1
    decoder_max_seq_len: int = 512
    decoder_positional_encoding: PositionalEncoding = "rope"
    decoder_gate_self_attn: bool = False
    decoder_gate_cross_attn: bool = False
    contrastive_temperature: float = 0.1
    min_log_scale: float = -6.0
    hybrid_single_encoder_pass: bool = False

    def __post_init__(self) -> None:
        if self.pretrain_mode not in PRETRAIN_MODES:
            raise ValueError(f"pretrain_mode {self.pretrain_mode!r} is not one of {PRETRAIN_MODES}")
        if self.decoder_positional_encoding not in POSITIONAL_ENCODINGS:
            raise ValueError(f"decoder_positional_encoding {self.decoder_positional_encoding!r} is not one of "
                             f"{POSITIONAL_ENCODINGS}")
        if self.uses_vocab and (self.atom_vocab_size is None or self.bond_vocab_size is None):
            raise ValueError(f"pretrain_mode {self.pretrain_mode!r} needs atom_vocab_size and bond_vocab_size")
        if self.uses_decoder:
            self._check_decoder()

    def _check_decoder(self) -> None:
        if self.smiles_vocab_size is None:
            raise ValueError(f"pretrain_mode {self.pretrain_mode!r} needs smiles_vocab_size")
        check_decoder_heads(self.latent_dim, self.decoder_num_attention_heads, self.decoder_positional_encoding)
        if self.decoder_positional_encoding == "sinusoidal" and (
            self.decoder_gate_self_attn or self.decoder_gate_cross_attn
        ):
            raise ValueError("decoder gates exist only with decoder_positional_encoding 'rope'")

    @property
    def uses_vocab(self) -> bool:
        return self.pretrain_mode in ("vocab", "hybrid")

    @property
    def uses_decoder(self) -> bool:
        return self.pretrain_mode in ("cmim", "hybrid")


def check_decoder_heads(latent_dim: int, decoder_num_attention_heads: int,
                        decoder_positional_encoding: PositionalEncoding) -> None:
    """The decoder's attention splits latent_dim over its heads, and RoPE rotates pairs of each head's dimensions.
    Also `kermt pretrain`'s flag check (cmim, hybrid), so a bad pair is refused before Ray starts."""
    if latent_dim % decoder_num_attention_heads:
        raise ValueError(f"latent_dim {latent_dim} (the decoder width) must be divisible by "
                         f"decoder_num_attention_heads {decoder_num_attention_heads}")
    head_dim = latent_dim // decoder_num_attention_heads
    if decoder_positional_encoding == "rope" and head_dim % 2:
        raise ValueError(f"RoPE needs an even decoder head dimension: latent_dim {latent_dim} / "
                         f"decoder_num_attention_heads {decoder_num_attention_heads} = {head_dim}")


@dataclass(frozen=True)
class PretrainLossConfig:
    """Loss weights. ``dist_coff`` scales the atom/bond vocab disagreement terms (not the fg one, as upstream);
    ``normalize_loss`` / ``normalize_gradient`` scale the Gaussian log-density terms' value / gradient by
    1 / latent_dim."""

    dist_coff: float = 0.1
    reconstruction_loss_weight: float = 1.0
    vocab_loss_weight: float = 1.0
    normalize_loss: bool = False
    normalize_gradient: bool = False


def configs_from_settings(settings: Mapping[str, Any]) -> tuple[PretrainHeadsConfig, PretrainLossConfig]:
    """Heads and loss configs from a checkpoint's pretraining settings (upstream flag names, plus the vocab sizes
    and latent_dim read off the tensors; e.g. ``kermt.checkpoint`` ``CheckpointSpec.pretrain``). Unknown names are
    ignored: a checkpoint stores many training flags that are not architecture.

    Upstream builds a sinusoidal decoder with gates requested by ignoring the gates (with a warning); so do we
    here, since the weights of such a file have no gate tensors.
    """
    heads_fields = {f.name for f in fields(PretrainHeadsConfig)}
    loss_fields = {f.name for f in fields(PretrainLossConfig)}
    heads = {k: v for k, v in settings.items() if k in heads_fields and v is not None}
    if heads.get("decoder_positional_encoding") == "sinusoidal":
        heads["decoder_gate_self_attn"] = heads["decoder_gate_cross_attn"] = False
    loss = {k: v for k, v in settings.items() if k in loss_fields and v is not None}
    return PretrainHeadsConfig(**heads), PretrainLossConfig(**loss)


__all__ = [
    "FG_SIZE",
    "PositionalEncoding",
    "PretrainHeadsConfig",
    "PretrainLossConfig",
    "PretrainMode",
    "check_decoder_heads",
    "configs_from_settings",
]
