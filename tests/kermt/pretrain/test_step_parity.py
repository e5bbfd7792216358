"""A pretraining step against upstream's own task classes: every logged loss term and every gradient.

The oracle (tests/data/kermt_upstream_pretrain/pretrain_step.npz, see the README there) was recorded by running
upstream's ``KermtTask`` / ``KermtHybridTask`` / ``KermtCMIMTask`` with its collators on the 26 fixture molecules,
train mode, dropout 0: numpy's global RNG seeded for the masking draws, then again (``forward_seed``) for the dynamic
depths, torch's RNG seeded with ``forward_seed`` for the latent noise. Here our ``KermtPretrainModel`` takes the
recorded labels and tokens, seeds the same RNGs, and must draw the same depths and noise, give the same loss terms
and the same gradient for every parameter.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_labels import sample_vocab_labels
from kermt.chem.vocab_smiles import SmilesVocab, encode_batch
from kermt.nn.depth import draw_depths
from kermt.checkpoint import read_checkpoint
from kermt.nn.pretrain.config import PretrainLossConfig, configs_from_settings
from tests.kermt.loss_oracles import pretrain_loss
from kermt.nn.pretrain.model import KermtPretrainModel, PretrainBatch
from kermt.nn.pretrain.vocab_heads import VocabTargets
from tests.conftest import FIXTURE_DIR
from tests.kermt.nn.pretrain.test_model import FIXTURE_ENCODER, fixture_heads
from tests.kermt.nn.upstream_fixtures import fixture_batch

ORACLE = FIXTURE_DIR.parent / "kermt_upstream_pretrain" / "pretrain_step.npz"
CASES = ("vocab", "hybrid", "hybrid_weighted", "cmim")
LOSS_RTOL = 1e-6
# Gradients are float32 batch sums taken in another order than upstream's (docs/numerics.md#parity-tolerances): each
# element to GRAD_RTOL of itself plus GRAD_ATOL of its tensor's largest element (where terms cancel), plus
# NOISE_FLOOR of the step's largest gradient, a tenth of a float32 ulp of it: gradients that are zero up to rounding
# (an attention key bias, which softmax ignores; query/key of cross-attention to a single memory token, where
# upstream gets exact zeros and we get ~1e-9) are noise that no formula fixes.
GRAD_RTOL, GRAD_ATOL, NOISE_FLOOR = 1e-5, 1e-5, 1e-8


@pytest.fixture(scope="module")
def oracle() -> dict[str, np.ndarray]:
    with np.load(ORACLE) as data:
        return {key: data[key] for key in data.files}


def settings(oracle: dict[str, np.ndarray], case: str) -> dict:
    return json.loads(str(oracle[f"{case}::settings"]))


def fixture_model(mode: str, checkpoint: str) -> KermtPretrainModel:
    """Our model of ``mode`` rebuilt by the library's safe reader from the checkpoint's settings and weights, with
    dropout 0 everywhere (as recorded). cmim: the hybrid checkpoint's latent head and decoder."""
    ckpt = read_checkpoint(FIXTURE_DIR / checkpoint)
    heads, _ = configs_from_settings(ckpt.spec.pretrain)
    heads = replace(heads, pretrain_mode=mode, decoder_dropout=0.0)
    model = KermtPretrainModel(replace(ckpt.spec.encoder, dropout=0.0), heads)
    state = ckpt.state_dict
    if mode == "cmim":
        state = {k: v for k, v in state.items() if k.startswith(("latent_dist.", "decoder."))}
    model.load_state_dict(state, strict=True)
    return model.train()


def recorded_batch(oracle: dict[str, np.ndarray], case: str) -> PretrainBatch:
    targets = None
    if f"{case}::av_labels" in oracle:
        targets = VocabTargets(
            atom=torch.from_numpy(oracle[f"{case}::av_labels"]),
            bond=torch.from_numpy(oracle[f"{case}::bv_labels"]),
            fg=torch.from_numpy(oracle["fg_labels"].astype(np.float32)),
        )
    tokens = oracle.get(f"{case}::tokens")
    return PretrainBatch(fixture_batch(), targets, None if tokens is None else torch.from_numpy(tokens))


def our_step(oracle: dict[str, np.ndarray], case: str):
    """Our forward + loss + backward with upstream's seeds: (model, output, loss)."""
    config = settings(oracle, case)
    model = fixture_model(config["mode"], config["ckpt"])
    np.random.seed(config["forward_seed"])
    torch.manual_seed(config["forward_seed"])
    output = model(recorded_batch(oracle, case))
    loss = pretrain_loss(output, recorded_batch(oracle, case), model.heads_config,
                         PretrainLossConfig(**config["loss"]))
    loss.total.backward()
    return model, output, loss


@pytest.fixture(scope="module")
def steps(oracle):
    return {case: our_step(oracle, case) for case in CASES}


def test_oracle_molecules_are_the_fixture_batch(oracle) -> None:
    with np.load(FIXTURE_DIR / "graph.npz") as graph:
        np.testing.assert_array_equal(oracle["smiles"], graph["smiles"])


@pytest.mark.parametrize("case", ["vocab", "hybrid", "hybrid_weighted"])
def test_our_label_sampling_draws_upstreams_labels(oracle, case) -> None:
    """The replayed labels are also what our sampler draws from the same seed."""
    atom_vocab, bond_vocab = (ContextVocab.load(FIXTURE_DIR / f"tiny_{kind}_vocab.json") for kind in ("atom", "bond"))
    rng = np.random.RandomState(settings(oracle, case)["label_seed"])
    labels = sample_vocab_labels([str(s) for s in oracle["smiles"]], atom_vocab, bond_vocab, rng)
    np.testing.assert_array_equal(labels.atom, oracle[f"{case}::av_labels"])
    np.testing.assert_array_equal(labels.bond, oracle[f"{case}::bv_labels"])


def test_our_tokens_equal_upstreams(oracle) -> None:
    vocab = SmilesVocab.load(FIXTURE_DIR / "tiny_smiles_vocab.pkl")
    tokens = encode_batch([str(s) for s in oracle["smiles"]], vocab, fixture_heads("hybrid").decoder_max_seq_len)
    for case in ("hybrid", "hybrid_weighted", "cmim"):
        np.testing.assert_array_equal(tokens.tokens, oracle[f"{case}::tokens"])


@pytest.mark.parametrize("case", CASES)
def test_depth_draws_replay_upstreams(oracle, case) -> None:
    config = settings(oracle, case)
    recorded = oracle[f"{case}::depths"]
    np.random.seed(config["forward_seed"])
    assert draw_depths(FIXTURE_ENCODER.depth, len(recorded)) == recorded.tolist()


@pytest.mark.parametrize("case", ["hybrid", "hybrid_weighted", "cmim"])
def test_latent_sample_equals_upstreams(oracle, steps, case) -> None:
    _, output, _ = steps[case]
    np.testing.assert_allclose(output.z.detach().numpy(), oracle[f"{case}::z"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_every_logged_loss_term_equals_upstreams(oracle, steps, case) -> None:
    ours = steps[case][2].scalars()
    names = [key.split("::")[1] for key in oracle if key.startswith(f"{case}::") and oracle[key].ndim == 0
             and oracle[key].dtype == np.float64]
    assert len(names) == (7 if settings(oracle, case)["mode"] != "hybrid" else 15)
    for name in names:
        assert ours[name] == pytest.approx(float(oracle[f"{case}::{name}"]), rel=LOSS_RTOL), name


def assert_gradients_equal_upstreams(oracle: dict[str, np.ndarray], case: str, model: torch.nn.Module) -> None:
    """Every gradient the oracle recorded for ``case`` equals ``model``'s (tolerances above)."""
    prefix = f"{case}::grad::"
    recorded = {key.removeprefix(prefix): oracle[key] for key in oracle if key.startswith(prefix)}
    ours = {name: p.grad for name, p in model.named_parameters() if name in recorded or p.grad is not None}
    if settings(oracle, case)["grads"] == "heads":  # the oracle skipped the encoder's gradients
        ours = {name: grad for name, grad in ours.items() if not name.startswith("latent_dist.kermt.")}
    # A parameter the step leaves unused (an encoder that drew zero iterations) has no gradient upstream; ours may
    # hold an exact zero there instead (docs/numerics.md#random-draws), never anything else.
    unused_upstream = set(ours) - set(recorded)
    assert all(ours[name] is not None and not ours[name].any() for name in unused_upstream), unused_upstream
    assert set(recorded) <= set(ours)
    largest = max(float(np.abs(grad).max()) for grad in recorded.values())
    for name, expected in recorded.items():
        atol = GRAD_ATOL * float(np.abs(expected).max()) + NOISE_FLOOR * largest
        np.testing.assert_allclose(ours[name].numpy(), expected, rtol=GRAD_RTOL, atol=atol, err_msg=name)


@pytest.mark.parametrize("case", ["vocab", "hybrid_weighted", "cmim"])
def test_every_gradient_equals_upstreams(oracle, steps, case) -> None:
    assert_gradients_equal_upstreams(oracle, case, steps[case][0])
