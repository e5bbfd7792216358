"""Pretraining losses in training use: gradients reach every parameter, cMIM options, edge cases."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from tests.kermt.loss_oracles import cmim_terms, contrastive_log_prob, pretrain_loss, vocab_loss
from kermt.nn.pretrain.cmim import LatentParams
from kermt.nn.pretrain.config import PretrainLossConfig
from kermt.nn.pretrain.model import KermtPretrainModel, PretrainBatch
from kermt.nn.pretrain.vocab_heads import VocabTargets
from tests.kermt.nn.pretrain.test_model import FIXTURE_ENCODER, fixture_heads
from tests.kermt.nn.upstream_fixtures import fixture_batch, outputs


@pytest.fixture(scope="module")
def batch() -> PretrainBatch:
    data = outputs()
    targets = VocabTargets(
        atom=torch.from_numpy(data["pt_av_labels_mask15_seed0"]),
        bond=torch.from_numpy(data["pt_bv_labels_mask15_seed0"]),
        fg=torch.from_numpy(data["pt_fg_labels"]),
    )
    return PretrainBatch(fixture_batch(), targets, torch.from_numpy(data["pt_hybrid_dec_tokens"]))


@pytest.mark.parametrize("mode", ["vocab", "cmim", "hybrid"])
def test_every_trainable_parameter_gets_a_gradient(mode: str, batch: PretrainBatch) -> None:
    # DDP runs without find_unused_parameters, so a training step must touch every trainable parameter. Depth 6
    # (the released one): with the fixtures' depth 3 a train-mode depth draw of 1 legitimately skips W_h.
    torch.manual_seed(0)
    model = KermtPretrainModel(replace(FIXTURE_ENCODER, depth=6), fixture_heads(mode)).train()
    out = model(batch, generator=torch.Generator().manual_seed(0))
    loss = pretrain_loss(out, batch, model.heads_config, PretrainLossConfig())
    loss.total.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_latent_sampling_is_reproducible_with_a_generator() -> None:
    params = LatentParams(mean=torch.zeros(3, 4), log_scale=torch.full((3, 4), math.log(2.0)))
    a = params.sample(torch.Generator().manual_seed(5))
    b = params.sample(torch.Generator().manual_seed(5))
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, 2.0 * torch.randn(3, 4, generator=torch.Generator().manual_seed(5)))


def test_contrastive_term_of_identical_latents_is_uniform() -> None:
    # Every cosine similarity is 1, so p(k=1) = e^{1/T} / (e^{1/T} + (M-1)·e^{1/T}/(M-1)) = 1/2.
    z = torch.ones(4, 3)
    torch.testing.assert_close(contrastive_log_prob(z, 0.1), torch.full((4,), math.log(0.5)))
    assert contrastive_log_prob(torch.randn(1, 3), 0.1).tolist() == [0.0]


def test_gaussian_terms_at_the_mean() -> None:
    params = LatentParams(mean=torch.zeros(2, 5), log_scale=torch.zeros(2, 5))
    terms = cmim_terms(params, params.mean, temperature=0.1)
    expected = -2.5 * math.log(2 * math.pi)  # 5 dims of log N(0; 0, 1)
    torch.testing.assert_close(terms.log_q_z_given_x, torch.full((2,), expected))
    torch.testing.assert_close(terms.log_P_z, torch.full((2,), expected))


@pytest.mark.parametrize("normalize_loss,normalize_gradient", [(True, False), (False, True)])
def test_normalisation_scales_density_value_or_gradient(normalize_loss: bool, normalize_gradient: bool) -> None:
    torch.manual_seed(0)
    mean = torch.randn(3, 4, requires_grad=True)
    params = LatentParams(mean=mean, log_scale=torch.zeros(3, 4))
    z = torch.randn(3, 4)
    plain = cmim_terms(params, z, 0.1)
    scaled = cmim_terms(params, z, 0.1, normalize_loss, normalize_gradient)
    expected_value = plain.log_q_z_given_x / 4 if normalize_loss else plain.log_q_z_given_x
    torch.testing.assert_close(scaled.log_q_z_given_x, expected_value)
    (grad_plain,) = torch.autograd.grad(plain.log_q_z_given_x.sum(), mean)
    (grad_scaled,) = torch.autograd.grad(scaled.log_q_z_given_x.sum(), mean)
    torch.testing.assert_close(grad_scaled, grad_plain / 4)


def test_vocab_loss_without_labelled_bonds_is_zero_not_nan(batch: PretrainBatch) -> None:
    model = KermtPretrainModel(FIXTURE_ENCODER, fixture_heads("vocab")).eval()
    with torch.no_grad():
        preds = model(batch).vocab
    targets = batch.vocab_targets
    no_bonds = VocabTargets(targets.atom, torch.zeros_like(targets.bond), targets.fg)
    loss = vocab_loss(preds, no_bonds)
    assert loss.bv.item() == 0.0 and torch.isfinite(loss.total)
