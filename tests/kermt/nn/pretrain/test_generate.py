"""SMILES generation: greedy equals greedy_decode, the sampling limits that must be greedy, keyed draws that do not
depend on the batch, the sampled distribution, and ids that decode to strings."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from kermt.chem.vocab_smiles import END, PAD, START, SmilesVocab
from kermt.nn.pretrain.decoder import SmilesDecoder, greedy_decode
from kermt.nn.pretrain.generate import SamplingConfig, filtered_probabilities, generate, next_tokens
from kermt.nn.pretrain.config import PretrainHeadsConfig
from kermt.pretrain.reconstruct import SequenceDraws
from tests.conftest import FIXTURE_DIR

VOCAB = SmilesVocab.load(FIXTURE_DIR / "tiny_smiles_vocab.pkl")  # 41 tokens, upstream's pickle
HEADS = PretrainHeadsConfig(
    pretrain_mode="cmim", smiles_vocab_size=len(VOCAB), latent_dim=16, decoder_num_layers=2,
    decoder_num_attention_heads=2, decoder_ffn_hidden_size=32, decoder_max_seq_len=24,
)
MAX_LEN = 24


def make_decoder(encoding: str = "rope") -> SmilesDecoder:
    torch.manual_seed(0)
    decoder = SmilesDecoder(replace(HEADS, decoder_positional_encoding=encoding)).eval()
    with torch.no_grad():  # make <end> likely enough that sequences finish at different lengths
        decoder.output_projection.bias[END] += 0.5
    return decoder


def latents(count: int = 8) -> torch.Tensor:
    return torch.randn(count, HEADS.latent_dim, generator=torch.Generator().manual_seed(1))


def draws(rows, samples=None, seed: int = 7) -> SequenceDraws:
    rows = np.asarray(rows, np.int64)
    return SequenceDraws(seed, rows, np.ones_like(rows) if samples is None else np.asarray(samples, np.int64))


def sequences(ids: torch.Tensor) -> list[list[int]]:
    """Each row up to and including its first <end> (the padding after it dropped; a sampled <pad> is kept)."""
    return [row[: row.index(END) + 1] if END in row else row for row in ids.tolist()]


@pytest.mark.parametrize("encoding", ["rope", "sinusoidal"])
def test_greedy_equals_greedy_decode(encoding: str) -> None:
    decoder, z = make_decoder(encoding), latents()
    ids = generate(decoder, z, SamplingConfig(temperature=0, max_len=MAX_LEN))
    torch.testing.assert_close(ids, greedy_decode(decoder, z, MAX_LEN), rtol=0, atol=0)
    lengths = {len(s) for s in sequences(ids)}
    assert len(lengths) > 1  # some rows finished early and left the batch: the rest still equals greedy_decode
    assert all(s[0] == START for s in sequences(ids))


@pytest.mark.parametrize("sampling", [
    SamplingConfig(temperature=1e-6, max_len=MAX_LEN),
    SamplingConfig(temperature=1.0, top_k=1, max_len=MAX_LEN),
    SamplingConfig(temperature=2.0, top_p=1e-9, max_len=MAX_LEN),
], ids=["temperature->0", "top_k=1", "top_p->0"])
def test_sampling_limits_equal_greedy(sampling: SamplingConfig) -> None:
    decoder, z = make_decoder(), latents()
    greedy = generate(decoder, z, SamplingConfig(temperature=0, max_len=MAX_LEN))
    sampled = generate(decoder, z, sampling, draws(range(len(z))).uniforms)
    torch.testing.assert_close(sampled, greedy, rtol=0, atol=0)


def test_sampling_draws_differ_from_greedy_and_between_seeds() -> None:
    decoder, z = make_decoder(), latents()
    sampling = SamplingConfig(temperature=1.0, max_len=MAX_LEN)
    greedy = sequences(generate(decoder, z, SamplingConfig(temperature=0, max_len=MAX_LEN)))
    seed_7 = sequences(generate(decoder, z, sampling, draws(range(8), seed=7).uniforms))
    seed_8 = sequences(generate(decoder, z, sampling, draws(range(8), seed=8).uniforms))
    assert seed_7 != greedy and seed_7 != seed_8


def test_same_key_same_tokens_whatever_the_batch() -> None:
    """Sequence (row r, sample s) draws from (seed, r, s) only: alone, in another order or in a bigger batch it
    generates the same tokens."""
    decoder, z = make_decoder(), latents()
    rows, samples = np.array([10, 11, 12, 13, 10, 11, 12, 13]), np.array([1, 1, 1, 1, 2, 2, 2, 2])
    sampling = SamplingConfig(temperature=1.3, top_k=20, max_len=MAX_LEN)
    whole = sequences(generate(decoder, z, sampling, draws(rows, samples).uniforms))
    order = [6, 1, 3]
    part = sequences(generate(decoder, z[order], sampling, draws(rows[order], samples[order]).uniforms))
    alone = sequences(generate(decoder, z[5:6], sampling, draws(rows[5:6], samples[5:6]).uniforms))
    assert part == [whole[i] for i in order] and alone == [whole[5]]
    assert whole[0] != whole[4]  # same latent, another sample number: other draws


def test_next_tokens_sample_the_filtered_softmax() -> None:
    """Inverse-CDF sampling with many uniforms reproduces softmax(logits / T) restricted to the top k."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 1.5]])
    config = SamplingConfig(temperature=0.7, top_k=4)
    expected = filtered_probabilities(logits, config)[0]
    assert (expected > 0).sum() == 4 and expected[3] == 0 and expected[4] == 0
    uniforms = draws(np.arange(20000)).uniforms(1)
    chosen = next_tokens(logits.expand(len(uniforms), -1), uniforms, config)
    frequencies = torch.bincount(chosen, minlength=6).double() / len(uniforms)
    torch.testing.assert_close(frequencies, expected.double(), atol=0.01, rtol=0)
    assert frequencies[3] == 0 and frequencies[4] == 0


def test_top_p_keeps_tokens_until_the_mass_exceeds_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filtered_probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.75)) > 0
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 <= 0.75 keeps the 2nd; 0.8 > 0.75 drops the 3rd
    assert (filtered_probabilities(logits, SamplingConfig(top_p=0.85)) > 0).sum() == 3
    assert (filtered_probabilities(logits, SamplingConfig(top_p=1.0)) > 0).sum() == 4


def test_a_uniform_at_the_top_never_picks_a_filtered_token() -> None:
    logits = torch.tensor([[3.0, 2.0, -5.0]])
    chosen = next_tokens(logits, torch.tensor([1.0 - 2**-53]), SamplingConfig(top_k=2))
    assert chosen.tolist() == [1]


def test_generated_ids_decode_to_smiles_strings() -> None:
    decoder, z = make_decoder(), latents()
    ids = generate(decoder, z, SamplingConfig(temperature=1.0, max_len=MAX_LEN), draws(range(8)).uniforms)
    assert ids.shape[1] <= MAX_LEN
    for row in sequences(ids):
        text = VOCAB.decode(row)
        assert text == "".join(VOCAB.itos[t] for t in row if t > 4)  # specials (<start>, <end>, ...) dropped
        assert row[-1] == END or len(row) == MAX_LEN
    assert (ids[:, 1:] == PAD).any()  # padding after <end>


def test_settings_are_checked() -> None:
    for bad in ({"temperature": -1}, {"top_k": 0}, {"top_p": 0}, {"top_p": 1.5}, {"max_len": 1}):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)
    with pytest.raises(ValueError, match="needs uniforms"):
        generate(make_decoder(), latents(), SamplingConfig(temperature=1.0))
    with pytest.raises(ValueError, match="sinusoidal decoder's 24 positions"):
        generate(make_decoder("sinusoidal"), latents(), SamplingConfig(temperature=0, max_len=25))
