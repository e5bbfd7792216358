"""bf16 against float32 on CUDA, with the tolerances the CPU tests document (docs/numerics.md#mixed-precision):
outputs within 5 % of the float32 tensor's largest magnitude, a train step's gradient at cosine > 0.99. CUDA's
bf16 matmuls accumulate in float32 like the CPU's, so the same bounds must hold; the distances are printed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kermt.data.dataset import MoleculeBatch
from kermt.nn.precision import autocast
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer
from kermt.train.step import FinetuneStepSettings, train_step
from tests.gpu.cuda import GPU_LANE, tf32
from tests.kermt.nn.test_precision import BF16_TOLERANCE, CHECKPOINTS, _features, _model
from tests.kermt.nn.upstream_fixtures import fixture_batch, load_upstream_checkpoint

pytestmark = GPU_LANE

GRADIENT_COSINE = 0.99


def _cuda(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.cuda()


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_bf16_outputs_on_cuda_stay_near_float32(name):
    model, graph, features = _model(name).cuda().eval(), fixture_batch().to("cuda"), _cuda(_features(name))
    with torch.no_grad(), tf32(False):
        reference = model(graph, features)
        with autocast("bf16", "cuda"):
            mixed = model(graph, features)
    for key in ("atom_view", "bond_view", "prediction"):
        expected, got = getattr(reference, key), getattr(mixed, key)
        assert got.dtype == torch.bfloat16, key
        fraction = float((got.float() - expected).abs().max()) / float(expected.abs().max())
        print(f"{name} {key}: bf16 distance {100 * fraction:.2f} % of max |fp32|")
        assert 0 < fraction <= BF16_TOLERANCE, (key, fraction)


def test_a_bf16_step_on_cuda_has_a_close_gradient():
    name = "ckpt_ft_reg.pt"
    graph, features = fixture_batch(), _features(name)
    tasks = load_upstream_checkpoint(name)["args"]["num_tasks"]
    targets = torch.linspace(-1.0, 1.0, graph.num_molecules * tasks).reshape(-1, tasks)
    batch = MoleculeBatch(graph, features, targets, np.arange(graph.num_molecules)).to("cuda")
    grads = {}
    for precision in ("fp32", "bf16"):
        model = _model(name).cuda().train()
        optimizer = build_optimizer(model, 1e-4, 0.0, 1.0)
        scheduler = NoamLR(optimizer, NoamSchedule(1.0, 2, 1, 1e-4, 1e-3, 1e-4))
        optimizer.step = lambda: None  # keep the step's gradients to compare them
        torch.manual_seed(0)
        with tf32(False):
            train_step(model, optimizer, scheduler, batch, FinetuneStepSettings("regression", 0.1, precision=precision),
                       np.random.default_rng(0))
        grads[precision] = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    cosine = float(torch.nn.functional.cosine_similarity(grads["fp32"], grads["bf16"], dim=0))
    print(f"bf16 step gradient: cosine {cosine:.5f} with the fp32 step's")
    assert cosine > GRADIENT_COSINE
