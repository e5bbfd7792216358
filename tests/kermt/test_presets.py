"""Named presets: the defaults each way of starting a model begins from, pinned to upstream's parsers, and the
upstream export carrying upstream finetune's training defaults."""

from __future__ import annotations

import dataclasses

import pytest

from kermt.checkpoint import read_checkpoint
from kermt.checkpoint.export import upstream_args
from kermt.config import ENCODER_ARCHITECTURE_KEYS, EncoderConfig
from kermt.nn.pretrain.config import PretrainHeadsConfig
from kermt.presets import FROM_SCRATCH, UPSTREAM_FINETUNE, UPSTREAM_PRETRAIN
from tests.conftest import FIXTURE_DIR


def _architecture(encoder: EncoderConfig) -> tuple:
    return tuple(getattr(encoder, k) for k in ENCODER_ARCHITECTURE_KEYS)


def test_each_preset_is_its_upstream_parsers_defaults():
    """docs/upstream-compatibility.md: main.py finetune (ReLU, depth 6, atom branches), pretrain_ddp.py (PReLU,
    depth 3, with 800 for its unusable --hidden_size 3), the release (PReLU, depth 6, both)."""
    assert _architecture(UPSTREAM_FINETUNE.encoder) == (800, 6, 4, 1, "ReLU", False)
    assert UPSTREAM_FINETUNE.encoder.embedding_output_type == "atom"
    # from scratch: upstream finetune's encoder (ReLU, atom branches) sized to the data (issue 38), with zero
    # padding (a number depends on the molecule and the model)
    assert FROM_SCRATCH == dataclasses.replace(UPSTREAM_FINETUNE.encoder, hidden_size=FROM_SCRATCH.hidden_size,
                                               depth=FROM_SCRATCH.depth, padding="zero")
    assert FROM_SCRATCH.hidden_size < UPSTREAM_FINETUNE.encoder.hidden_size
    assert _architecture(UPSTREAM_PRETRAIN.encoder) == (800, 3, 4, 1, "PReLU", False)
    assert UPSTREAM_PRETRAIN.encoder.embedding_output_type == "both"
    assert _architecture(EncoderConfig()) == (800, 6, 4, 1, "PReLU", False)
    training = UPSTREAM_FINETUNE.training
    assert (training.batch_size, training.dist_coff, training.fine_tune_coff, training.bond_drop_rate) == (
        32, 0.1, 1.0, 0.0)
    assert (UPSTREAM_FINETUNE.readout.attn_hidden, UPSTREAM_FINETUNE.readout.attn_out) == (4, 8)
    decoder = PretrainHeadsConfig
    assert (decoder.latent_dim, decoder.decoder_num_layers, decoder.decoder_num_attention_heads,
            decoder.decoder_ffn_hidden_size, decoder.decoder_max_seq_len) == (512, 3, 8, 2048, 512)


def test_an_export_carries_upstream_finetunes_training_defaults():
    args = vars(upstream_args(read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt").spec))
    assert {k: args[k] for k in dataclasses.asdict(UPSTREAM_FINETUNE.training)} == dataclasses.asdict(
        UPSTREAM_FINETUNE.training)
    assert args["parser_name"] == "finetune" and args["embedding_output_type"] == "both"


def test_a_preset_is_checked_like_any_encoder():
    with pytest.raises(ValueError, match="hidden_size 801 must be divisible by num_attn_head 4"):
        dataclasses.replace(FROM_SCRATCH, hidden_size=801, num_attn_head=4)
