"""`kermt pretrain` settings: defaults read from the presets, and the model dataclasses' own shape checks applied to
the flags before Ray starts."""

from __future__ import annotations

import dataclasses

import pytest

from kermt.config import ENCODER_ARCHITECTURE_KEYS
from kermt.errors import UserError
from kermt.nn.pretrain.config import PretrainHeadsConfig
from kermt.presets import UPSTREAM_PRETRAIN
from ray_app.pretrain.config import PretrainConfig, resolve

DECODER_KEYS = ("latent_dim", "decoder_num_layers", "decoder_num_attention_heads", "decoder_ffn_hidden_size",
                "decoder_dropout", "decoder_max_seq_len", "decoder_positional_encoding", "decoder_gate_self_attn",
                "decoder_gate_cross_attn", "contrastive_temperature")


def test_defaults_are_upstream_pretrains_preset():
    config = PretrainConfig(data_path="corpus")
    encoder, loss = UPSTREAM_PRETRAIN.encoder, UPSTREAM_PRETRAIN.loss
    assert {k: getattr(config, k) for k in (*ENCODER_ARCHITECTURE_KEYS, "dropout")} == {
        k: getattr(encoder, k) for k in (*ENCODER_ARCHITECTURE_KEYS, "dropout")}
    assert (config.depth, config.activation) == (3, "PReLU")  # pretrain_ddp.py's, not the finetune parser's
    assert {k: getattr(config, k) for k in dataclasses.asdict(loss)} == dataclasses.asdict(loss)
    assert {k: getattr(config, k) for k in DECODER_KEYS} == {k: getattr(PretrainHeadsConfig, k) for k in DECODER_KEYS}


@pytest.mark.parametrize(("flags", "message"), [
    (["--hidden_size", "801"], "hidden_size 801 must be divisible by num_attn_head 4"),
    (["--pretrain_mode", "cmim", "--latent_dim", "100", "--decoder_num_attention_heads", "8"],
     "latent_dim 100 (the decoder width) must be divisible by decoder_num_attention_heads 8"),
    (["--pretrain_mode", "hybrid", "--latent_dim", "24", "--decoder_num_attention_heads", "8"],
     "RoPE needs an even decoder head dimension: latent_dim 24 / decoder_num_attention_heads 8 = 3"),
])
def test_a_shape_the_model_cannot_build_is_refused_as_the_dataclass_would(flags, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(["--data_path", "corpus", *flags])


def test_a_vocab_run_ignores_the_decoder_it_does_not_build():
    config, _ = resolve(["--data_path", "corpus", "--latent_dim", "24"])
    assert config.latent_dim == 24
