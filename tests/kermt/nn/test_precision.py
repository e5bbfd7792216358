"""bf16 autocast (kermt.nn.precision): the fixture checkpoints' outputs stay within the documented distance of
float32 (docs/numerics.md#mixed-precision), and a bf16 train step keeps float32 parameters and gradients that point
where the float32 step's do."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kermt.data.dataset import MoleculeBatch
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.precision import autocast
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer
from kermt.train.step import FinetuneStepSettings, train_step
from tests.kermt.nn.upstream_fixtures import (
    finetune_config_from_args,
    fixture_batch,
    load_upstream_checkpoint,
    outputs,
)

BF16_TOLERANCE = 0.05  # of the largest |value| of the float32 tensor; measured at most 0.039 (numerics.md)
CHECKPOINTS = {"ckpt_ft_reg.pt": "ft_reg", "ckpt_ft_reg_ts.pt": "ft_reg_ts", "ckpt_ft_cls.pt": "ft_cls"}


def _model(name: str) -> KermtFinetuneModel:
    ckpt = load_upstream_checkpoint(name)
    model = KermtFinetuneModel(finetune_config_from_args(ckpt["args"]))
    model.load_state_dict(ckpt["state_dict"], strict=False)
    return model


def _features(name: str) -> torch.Tensor | None:
    features = outputs().get(f"{CHECKPOINTS[name]}_features_batch")
    return None if features is None else torch.from_numpy(features)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_bf16_outputs_stay_near_float32(name):
    model, graph, features = _model(name).eval(), fixture_batch(), _features(name)
    with torch.no_grad():
        reference = model(graph, features)
        with autocast("bf16", "cpu"):
            mixed = model(graph, features)
    for key in ("atom_view", "bond_view", "prediction"):
        expected, got = getattr(reference, key), getattr(mixed, key)
        assert got.dtype == torch.bfloat16, key  # autocast did run the heads in bf16
        distance = float((got.float() - expected).abs().max())
        assert 0 < distance <= BF16_TOLERANCE * float(expected.abs().max()), (key, distance)


def test_a_bf16_step_keeps_float32_parameters_and_a_close_gradient():
    name = "ckpt_ft_reg.pt"
    graph, features = fixture_batch(), _features(name)
    tasks = load_upstream_checkpoint(name)["args"]["num_tasks"]
    targets = torch.linspace(-1.0, 1.0, graph.num_molecules * tasks).reshape(-1, tasks)
    batch = MoleculeBatch(graph, features, targets, np.arange(graph.num_molecules))
    grads = {}
    for precision in ("fp32", "bf16"):
        model = _model(name).train()
        optimizer = build_optimizer(model, 1e-4, 0.0, 1.0)
        scheduler = NoamLR(optimizer, NoamSchedule(1.0, 2, 1, 1e-4, 1e-3, 1e-4))
        original_step = optimizer.step
        optimizer.step = lambda: None  # keep the gradients of the step to compare them
        torch.manual_seed(0)  # the same dropout masks
        settings = FinetuneStepSettings("regression", 0.1, precision=precision)
        step = train_step(model, optimizer, scheduler, batch, settings, np.random.default_rng(0))
        optimizer.step = original_step
        assert step.objective_share.dtype == torch.float32 and torch.isfinite(step.objective_share)
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters()
                   if p.grad is not None)
        grads[precision] = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    cosine = torch.nn.functional.cosine_similarity(grads["fp32"], grads["bf16"], dim=0)
    assert cosine > 0.99, float(cosine)
