"""Run configuration for `kermt pretrain`: upstream ``pretrain_ddp.py``'s flag names and defaults plus the Ray flags
of `kermt finetune`, as one typed pydantic model (flags, ``--config FILE.yaml``, defaults).

Deliberate differences from upstream (docs/upstream-compatibility.md#pretraining):
- ``--data_path`` is a corpus directory prepared by `kermt corpus` (upstream: ``--train_data_path`` shards); the
  vocab paths default to the corpus's own vocabularies.
- ``--hidden_size`` defaults to 800 (upstream's default 3 is unusable and always overridden).
- ``--seed`` seeds everything (upstream never applies it); the validation slice is a held-out ``--val_fraction``
  of the corpus fixed by the seed (upstream: ``--val_data_path``).
- ``--batch_size`` is per worker at ``MAX`` workers: the global batch (``--global_batch_size``, default
  ``batch_size × MAX``) is fixed for the run, whatever number of workers shares it, so every step and the final
  weights do not depend on it.
- Bond dropout is not offered: upstream's mislabels the bonds it keeps, and exact distributed math would need
  per-molecule draws (future work).
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field, model_validator

from kermt.config import check_attention_heads
from kermt.nn.pretrain.config import PretrainHeadsConfig, check_decoder_heads
from kermt.presets import UPSTREAM_FINETUNE, UPSTREAM_PRETRAIN
from kermt.registry import (
    DEFAULT_PRETRAIN_MODE,
    Activation,
    DropoutDraws,
    PositionalEncoding,
    Precision,
    PretrainMode,
)
from ray_app.common import settings
from ray_app.common.data_parallel import DataParallelSettings
from ray_app.common.settings import Source

# Defaults of upstream pretrain_ddp.py's parser: kermt.presets (encoder, loss weights) and PretrainHeadsConfig's
# field defaults (latent head and decoder); read as class attributes, since an instance needs the corpus's vocab sizes.
_ENCODER, _LOSS, _HEADS = UPSTREAM_PRETRAIN.encoder, UPSTREAM_PRETRAIN.loss, PretrainHeadsConfig


class PretrainConfig(DataParallelSettings):
    """Every setting of a pretraining run. Field names are the flag names."""

    # data
    data_path: str = Field(description="corpus directory prepared by `kermt corpus` (local or URI)")
    atom_vocab_path: Optional[str] = Field(None, description="atom vocab JSON (default: the corpus's)")
    bond_vocab_path: Optional[str] = Field(None, description="bond vocab JSON (default: the corpus's)")
    smiles_vocab_path: Optional[str] = Field(None, description="SMILES vocab JSON (default: the corpus's)")
    val_fraction: float = Field(0.01, ge=0, lt=1, description="held-out validation slice, fixed by the seed")
    max_val_batches: int = Field(10, ge=1, description="global validation batches per validation")
    shuffle_window: int = Field(
        4, ge=1, description="corpus shards whose molecules are shuffled together each epoch (the shards' order is "
        "shuffled too); a worker holds about two windows of shards, whatever the corpus size")
    seed: int = Field(UPSTREAM_FINETUNE.training.seed,  # the same default in both upstream parsers
                      description="seed of initialisation, shuffling, masking, depth and latent draws")
    continue_from: Optional[str] = Field(
        None, description="pretraining checkpoint (.pt or native dir) to continue from: its encoder and heads (a "
        "vocab one may continue as hybrid: latent head and decoder start fresh)")
    trust_checkpoint: bool = Field(False, description="allow full unpickling of --continue_from (runs its code)")
    # task and losses
    pretrain_mode: PretrainMode = Field(DEFAULT_PRETRAIN_MODE, description="pretraining objective")
    vocab_loss_weight: float = Field(_LOSS.vocab_loss_weight, ge=0, description="hybrid: weight of the vocab loss")
    dist_coff: float = Field(_LOSS.dist_coff, ge=0, description="weight of the atom/bond vocab disagreement terms")
    contrastive_temperature: float = Field(_HEADS.contrastive_temperature, gt=0,
                                           description="cmim/hybrid: temperature of the contrastive term")
    reconstruction_loss_weight: float = Field(_LOSS.reconstruction_loss_weight, ge=0,
                                              description="cmim/hybrid: weight of the SMILES loss")
    normalize_loss: bool = Field(_LOSS.normalize_loss, description="scale the Gaussian log-densities by 1/latent_dim")
    normalize_gradient: bool = Field(_LOSS.normalize_gradient, description="scale only their gradient by 1/latent_dim")
    per_rank_loss: bool = Field(
        False, description="upstream's DDP semantics: each worker's batch means and cMIM negatives from its own "
        "batch (results then depend on the number of workers; default: the global batch's)")
    # encoder
    hidden_size: int = Field(_ENCODER.hidden_size, ge=1, description="encoder width")
    depth: int = Field(_ENCODER.depth, ge=1, description="message-passing depth")
    num_attn_head: int = Field(_ENCODER.num_attn_head, ge=1, description="attention heads per transformer block")
    num_mt_block: int = Field(_ENCODER.num_mt_block, ge=1, description="multi-head transformer blocks")
    dropout: float = Field(_ENCODER.dropout, ge=0, lt=1, description="encoder dropout")
    dropout_draws: DropoutDraws = Field(
        "per_molecule", description="dropout masks drawn per molecule from (seed, step, molecule): N workers equal "
        "1, also after an elastic restart (the sinusoidal decoder's layers excepted); torch: torch's RNG per worker")
    activation: Activation = Field(_ENCODER.activation, description="activation function")
    bias: bool = Field(_ENCODER.bias, description="linear layers with a bias term")
    precision: Precision = Field(
        "fp32", description="bf16: forward passes under bfloat16 autocast (neighbour sums, losses, weights and "
        "optimizer state stay float32); see docs/numerics.md for how far the losses move")
    # cMIM latent and decoder
    latent_dim: int = Field(_HEADS.latent_dim, ge=1, description="cmim/hybrid: latent size (the decoder width)")
    decoder_num_layers: int = Field(_HEADS.decoder_num_layers, ge=1, description="SMILES decoder layers")
    decoder_num_attention_heads: int = Field(_HEADS.decoder_num_attention_heads, ge=1,
                                             description="decoder attention heads")
    decoder_ffn_hidden_size: int = Field(_HEADS.decoder_ffn_hidden_size, ge=1, description="decoder feed-forward width")
    decoder_dropout: float = Field(_HEADS.decoder_dropout, ge=0, lt=1, description="decoder dropout probability")
    decoder_max_seq_len: int = Field(_HEADS.decoder_max_seq_len, ge=3,
                                     description="longest SMILES token sequence, <start> included")
    decoder_positional_encoding: PositionalEncoding = Field(_HEADS.decoder_positional_encoding,
                                                            description="decoder positional encoding")
    decoder_gate_self_attn: bool = Field(_HEADS.decoder_gate_self_attn,
                                         description="gated self-attention in the decoder")
    decoder_gate_cross_attn: bool = Field(_HEADS.decoder_gate_cross_attn,
                                          description="gated cross-attention to the latent")
    # schedule (epochs, batch sizes, learning rates) and Ray placement: DataParallelSettings
    # outputs and logging
    save_dir: str = Field("runs/pretrain", description="model/ (native), model.pt (upstream layout), metrics.csv")
    save_interval: int = Field(100, ge=1, description="checkpoint every this many steps (and at every epoch end)")
    val_interval: int = Field(0, ge=0, description="validate every this many steps (0: at epoch ends only)")
    train_interval: int = Field(10, ge=1, description="one log line and metrics row every this many steps")
    tensorboard: bool = Field(False, description="write TensorBoard events to save_dir")
    stop_after_steps: Optional[int] = Field(
        None, ge=1, description="end the run after this many global steps, checkpointed (re-run to continue)")

    @model_validator(mode="after")
    def _check(self) -> "PretrainConfig":
        # The dataclasses' own checks, before Ray starts; the vocab sizes they also need come from the corpus later.
        if self.pretrain_mode != "vocab":
            check_decoder_heads(self.latent_dim, self.decoder_num_attention_heads, self.decoder_positional_encoding)
        check_attention_heads(self.hidden_size, self.num_attn_head)
        return self


def resolve(argv: list[str] | None) -> tuple[PretrainConfig, dict[str, Source]]:
    return settings.resolve(argv, PretrainConfig, "kermt pretrain")


__all__ = ["PretrainConfig", "resolve"]
