"""SMILES decoder properties: rotary maths, causality, padding, gates, the sinusoidal variant's layout."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from kermt.nn.pretrain.decoder import SmilesDecoder, TeacherForcing, greedy_decode, reconstruction_terms
from kermt.nn.pretrain.decoder_layers import RotaryEmbedding
from kermt.nn.pretrain.config import PretrainHeadsConfig

SMALL = PretrainHeadsConfig(
    pretrain_mode="cmim", smiles_vocab_size=12, latent_dim=16, decoder_num_layers=2, decoder_num_attention_heads=2,
    decoder_ffn_hidden_size=32, decoder_max_seq_len=20,
)


def make_decoder(**changes) -> SmilesDecoder:
    torch.manual_seed(0)
    return SmilesDecoder(replace(SMALL, **changes)).eval()


def test_rotary_embedding_equals_complex_rotation() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=8)
    x = torch.randn(2, 5, 3, 8)
    half = x.shape[-1] // 2
    pairs = torch.complex(x[..., :half], x[..., half:])  # pair (x_i, x_{i+d/2}) as one complex number
    angles = torch.arange(5.0)[:, None] * (10000.0 ** (-torch.arange(0, 8, 2) / 8.0))
    rotated = pairs * torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    expected = torch.cat([rotated.real, rotated.imag], dim=-1)
    torch.testing.assert_close(rope(x), expected, atol=1e-5, rtol=1e-5)


def test_rotary_scores_depend_only_on_relative_position() -> None:
    torch.manual_seed(1)
    rope = RotaryEmbedding(head_dim=8)
    q = rope(torch.randn(1, 1, 1, 8).expand(1, 6, 1, 8))
    k = rope(torch.randn(1, 1, 1, 8).expand(1, 6, 1, 8))
    scores = torch.einsum("bqhd,bkhd->qk", q, k)
    torch.testing.assert_close(scores[1:, 1:], scores[:-1, :-1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoding", ["rope", "sinusoidal"])
def test_decoder_is_causal(encoding: str) -> None:
    decoder = make_decoder(decoder_positional_encoding=encoding)
    memory = torch.randn(2, 1, 16)
    tokens = torch.tensor([[1, 5, 6, 7, 8, 9], [1, 6, 6, 7, 5, 2]])
    changed = tokens.clone()
    changed[:, 4] = 10
    with torch.no_grad():
        before, after = decoder(tokens, memory, None), decoder(changed, memory, None)
    torch.testing.assert_close(before[:, :4], after[:, :4])
    assert not torch.allclose(before[:, 4:], after[:, 4:])


@pytest.mark.parametrize("encoding", ["rope", "sinusoidal"])
def test_padded_keys_do_not_affect_real_positions(encoding: str) -> None:
    decoder = make_decoder(decoder_positional_encoding=encoding)
    memory = torch.randn(1, 1, 16)
    full = torch.tensor([[1, 5, 6, 2, 0, 0, 0]])
    teacher = TeacherForcing.from_tokens(full)
    other_pads = teacher.inputs.clone()
    other_pads[0, 4:] = 7  # what sits at padded positions must not matter
    with torch.no_grad():
        a = decoder(teacher.inputs, memory, teacher.padding_mask)
        b = decoder(other_pads, memory, teacher.padding_mask)
        short = decoder(full[:, :3], memory, None)
    real = ~teacher.padding_mask[0]
    torch.testing.assert_close(a[0, real], b[0, real])
    torch.testing.assert_close(a[0, :3], short[0])


def test_open_gate_equals_no_gate() -> None:
    plain = make_decoder()
    gated = make_decoder(decoder_gate_self_attn=True, decoder_gate_cross_attn=True)
    assert {"decoder_layers.0.self_attn_gate.weight", "decoder_layers.1.cross_attn_gate.bias"} <= set(
        gated.state_dict()
    )
    state = dict(plain.state_dict())
    for name, tensor in gated.state_dict().items():
        if "_gate." in name:  # σ(0·x + 40) == 1: the gate passes everything through
            state[name] = torch.zeros_like(tensor) if name.endswith("weight") else torch.full_like(tensor, 40.0)
    gated.load_state_dict(state, strict=True)
    tokens, memory = torch.tensor([[1, 5, 6, 7, 2]]), torch.randn(1, 1, 16)
    with torch.no_grad():
        torch.testing.assert_close(gated(tokens, memory, None), plain(tokens, memory, None))


def test_sinusoidal_layout_and_table() -> None:
    decoder = make_decoder(decoder_positional_encoding="sinusoidal")
    keys = set(decoder.state_dict())
    assert {"pos_encoder.pe", "transformer_decoder.layers.1.multihead_attn.in_proj_weight",
            "token_embedding.weight", "output_projection.bias"} <= keys
    assert not any(k.startswith("decoder_layers.") for k in keys)
    pe = decoder.pos_encoder.pe
    assert pe.shape == (20, 1, 16)
    assert pe[3, 0, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 16)), abs=1e-6)
    assert pe[3, 0, 5].item() == pytest.approx(math.cos(3 / 10000 ** (4 / 16)), abs=1e-6)


def test_sinusoidal_with_gates_is_rejected() -> None:
    with pytest.raises(ValueError, match="gates"):
        replace(SMALL, decoder_positional_encoding="sinusoidal", decoder_gate_self_attn=True)


def test_reconstruction_terms_ignore_padding() -> None:
    logits = torch.log(torch.tensor([[[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]]))
    targets = torch.tensor([[2, 1, 0]])
    result = reconstruction_terms(logits, targets, targets == 0)
    expected = -(math.log(0.7) + math.log(0.3)) / 2
    assert result.loss.item() == pytest.approx(expected, rel=1e-6)
    assert result.accuracy.item() == pytest.approx(0.5)


def test_greedy_decode_is_consistent_with_teacher_forcing() -> None:
    decoder = make_decoder()
    z = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    tokens = greedy_decode(decoder, z, max_len=8)
    assert tokens.shape[0] == 3 and tokens.shape[1] <= 8 and (tokens[:, 0] == 1).all()
    with torch.no_grad():
        logits = decoder(tokens[:, :-1], z.unsqueeze(1), None)
    for row, row_logits in zip(tokens, logits):
        steps = len(row) - 1
        ended = (row[1:] == 2).nonzero()
        if len(ended):
            steps = int(ended[0]) + 1  # compare up to and including <end>
        assert torch.equal(row_logits[:steps].argmax(dim=-1), row[1 : steps + 1])
