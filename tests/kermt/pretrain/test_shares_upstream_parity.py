"""The distributed pretraining loss (kermt.pretrain.loss, shares of global counts) at world size 1 against
upstream's own task classes: every logged term and every gradient of the recorded step
(tests/data/kermt_upstream_pretrain/pretrain_step.npz). The latent noise is handed over as
``PretrainBatch.latent_noise`` (upstream's recorded ε); the depths are replayed from numpy's global RNG."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from kermt.nn.pretrain.config import PretrainLossConfig
from kermt.pretrain.loss import GlobalView, pretrain_shares
from tests.kermt.pretrain.test_step_parity import (
    CASES,
    LOSS_RTOL,
    ORACLE,
    assert_gradients_equal_upstreams,
    fixture_model,
    recorded_batch,
    settings,
)

# share name -> upstream's logged name, where they differ
UPSTREAM_NAMES = {"av": "av_loss", "bv": "bv_loss", "fg": "fg_loss", "av_dist": "av_dist_loss",
                  "bv_dist": "bv_dist_loss", "fg_dist": "fg_dist_loss", "vocab_total": "vocab_loss",
                  "recon": "recon_loss", "cmim": "cmim_loss"}


@pytest.fixture(scope="module")
def oracle() -> dict[str, np.ndarray]:
    with np.load(ORACLE) as data:
        return {key: data[key] for key in data.files}


def one_process_shares(oracle, case):
    """Our model's train step on the recorded batch, loss as the shares of a world of one: (model, shares)."""
    config = settings(oracle, case)
    model = fixture_model(config["mode"], config["ckpt"])
    batch = recorded_batch(oracle, case)
    if f"{case}::eps" in oracle:
        batch = replace(batch, latent_noise=torch.from_numpy(oracle[f"{case}::eps"]))
    np.random.seed(config["forward_seed"])
    output = model(batch)
    targets = batch.vocab_targets
    labelled = [0, 0] if targets is None else [int((targets.atom != 0).sum()), int((targets.bond != 0).sum())]
    graph = batch.graph
    counts = [graph.a_scope.shape[0], graph.f_atoms.shape[0] - 1, (graph.f_bonds.shape[0] - 1) // 2, *labelled]
    view = GlobalView(torch.tensor(counts, dtype=torch.float32), True, output.z, 0)
    shares = pretrain_shares(output, targets, view, model.heads_config, PretrainLossConfig(**config["loss"]))
    shares["loss"].backward()
    return model, shares


@pytest.fixture(scope="module")
def runs(oracle):
    return {case: one_process_shares(oracle, case) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_every_share_equals_upstreams_logged_term(oracle, runs, case) -> None:
    _, shares = runs[case]
    names = {UPSTREAM_NAMES.get(name, name) for name in shares}
    recorded = {key.split("::")[1] for key in oracle if key.startswith(f"{case}::") and oracle[key].ndim == 0
                and oracle[key].dtype == np.float64}
    assert recorded <= names
    for name, value in shares.items():
        upstream = UPSTREAM_NAMES.get(name, name)
        if upstream in recorded:
            assert float(value.detach()) == pytest.approx(float(oracle[f"{case}::{upstream}"]), rel=LOSS_RTOL), name


@pytest.mark.parametrize("case", ["vocab", "hybrid_weighted", "cmim"])
def test_every_gradient_equals_upstreams(oracle, runs, case) -> None:
    assert_gradients_equal_upstreams(oracle, case, runs[case][0])
