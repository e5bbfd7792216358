"""Architecture comes from the checkpoint; contradictions are errors; training settings stay the user's."""

from __future__ import annotations

import pytest

from kermt.checkpoint import ArchitectureConflictError, merge_encoder, merge_finetune_config, read_checkpoint
from tests.conftest import FIXTURE_DIR


def _spec(name: str):
    return read_checkpoint(FIXTURE_DIR / f"{name}.pt").spec


def test_contradicting_encoder_setting_names_both_values():
    spec = _spec("ckpt_pretrain_vocab")
    with pytest.raises(ArchitectureConflictError) as info:
        merge_encoder(spec.encoder, {"hidden_size": 800, "num_attn_head": 4, "depth": 3}, source="vocab.pt")
    message = str(info.value)
    assert "encoder.hidden_size: you set 800 but the checkpoint was trained with 16" in message
    assert "encoder.num_attn_head: you set 4 but the checkpoint was trained with 2" in message
    assert "depth" not in message  # equal values are fine
    assert "vocab.pt" in message


def test_training_settings_are_the_users_not_the_checkpoints():
    """Upstream would silently take dropout 0.1 and self_attention False from the hybrid ckpt
    (docs/upstream-compatibility.md#loading-and-the-args-rule)."""
    spec = _spec("ckpt_pretrain_hybrid")
    assert spec.encoder.dropout == 0.1
    config = merge_finetune_config(
        spec, encoder={"dropout": 0.0, "activation": "PReLU"},
        readout={"self_attention": True, "attn_out": 4},
        head={"num_tasks": 2, "dataset_type": "classification", "dropout": 0.2, "ffn_hidden_size": 24},
    )
    assert config.encoder.dropout == 0.0
    assert config.readout.self_attention is True and config.readout.attn_out == 4
    assert (config.head.dropout, config.head.ffn_hidden_size, config.head.activation) == (0.2, 24, "PReLU")
    assert config.encoder.hidden_size == 16 and config.encoder.depth == 3
    defaults = merge_finetune_config(spec, head={"num_tasks": 1, "dataset_type": "regression"})
    assert defaults.encoder.dropout == 0.0  # the library default, not the checkpoint's 0.1


def test_finetuned_checkpoint_fixes_the_head_shape():
    spec = _spec("ckpt_ft_reg")
    config = merge_finetune_config(spec, head={"dropout": 0.05, "num_tasks": 2})
    assert (config.head.num_tasks, config.head.features_size, config.head.ffn_num_layers) == (2, 200, 3)
    assert config.readout.self_attention is True and config.head.dropout == 0.05
    with pytest.raises(ArchitectureConflictError) as info:
        merge_finetune_config(spec, readout={"self_attention": False}, head={"features_size": 0, "num_tasks": 2})
    assert "readout.self_attention: you set False but the checkpoint was trained with True" in str(info.value)
    assert "head.features_size: you set 0 but the checkpoint was trained with 200" in str(info.value)


def test_unknown_setting_is_an_error():
    with pytest.raises(ValueError, match="unknown encoder setting"):
        merge_encoder(_spec("ckpt_ft_cls").encoder, {"hiden_size": 16})
