"""A training step on CUDA: it never waits for the device, and fused Adam (what build_optimizer picks on CUDA)
moves the parameters where torch's multi-tensor Adam does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.dispatch_audit import DispatchAudit, optimizer_host_tensors
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer
from kermt.train.step import FinetuneStepSettings, train_step
from tests.gpu.cuda import GPU_LANE, tf32
from tests.kermt.nn.test_host_syncs import SMILES, _model, molecules  # noqa: F401 - molecules: a fixture

pytestmark = GPU_LANE

# Fused and multi-tensor Adam evaluate the same formula with other roundings (fused keeps its step count on the
# device and folds the bias corrections into one expression): a few float32 ulps per step, far below one lr step.
FUSED_RTOL, FUSED_ATOL = 1e-5, 1e-7


def _trainer(model):
    optimizer = build_optimizer(model, 1e-3, 1e-4, 1.0)
    return optimizer, NoamLR(optimizer, NoamSchedule(1.0, 4, 2, 1e-3, 1e-2, 1e-3))


def _train_batch(molecules, model):  # noqa: F811 - the fixture
    rows = np.arange(len(SMILES))
    spec = model.kermt.aggregation_spec(training=True)
    return molecules.batch(rows, operators=spec, global_rows=rows).pin_memory().to("cuda", non_blocking=True)


@pytest.mark.parametrize(("dropout", "draws"), [(0.0, "torch"), (0.2, "torch"), (0.2, "per_molecule")],
                         ids=["stacked", "loop", "keyed_stacked"])
def test_a_cuda_train_step_never_synchronises(molecules, dropout, draws):  # noqa: F811 - the fixture
    """torch's sync debug mode raises on any call that blocks the host on the device (a value read back, a
    pageable copy, a data-dependent shape); the dispatch audit must agree that there is none. Per-molecule dropout
    computes its masks on the device from the batch's molecule ids."""
    model = _model(dropout).cuda()
    optimizer, scheduler = _trainer(model)
    assert optimizer.defaults["fused"] is True
    batch = _train_batch(molecules, model)
    settings = FinetuneStepSettings("regression", 0.1, dropout_draws=draws, seed=4)
    train_step(model, optimizer, scheduler, batch, settings, np.random.default_rng(0))  # Adam's state created
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with DispatchAudit(optimizer_host_tensors(optimizer)) as audit:
            for step in range(1, 4):
                result = train_step(model, optimizer, scheduler, batch, settings, np.random.default_rng(step),
                                    global_step=step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert audit.sync_count == 0, audit.syncs
    assert result.objective_share.is_cuda and torch.isfinite(result.objective_share).item()


def test_fused_adam_moves_parameters_like_multi_tensor_adam():
    """The same gradients fed to both implementations for 5 steps: what differs is only Adam's arithmetic (with
    gradients recomputed, float noise in near-zero gradients would be amplified by Adam's normalisation)."""
    params = {}
    for fused in (True, False):
        model = _model().cuda()
        optimizer, scheduler = _trainer(model)
        if not fused:  # the same groups and settings, torch's multi-tensor (foreach) implementation
            for group in optimizer.param_groups:
                group["fused"], group["foreach"] = False, True
        assert optimizer.param_groups[0]["fused"] is fused
        for step in range(5):
            generator = torch.Generator().manual_seed(step)
            for param in model.parameters():
                param.grad = torch.randn(param.shape, generator=generator).cuda()
            optimizer.step()
            scheduler.step()
        params[fused] = {name: p.detach().cpu() for name, p in model.named_parameters()}
    worst = max(float((params[True][n] - params[False][n]).abs().max()) for n in params[True])
    print(f"fused vs multi-tensor Adam after 5 steps: max parameter distance {worst:.2e}")
    for name, value in params[True].items():
        torch.testing.assert_close(value, params[False][name], rtol=FUSED_RTOL, atol=FUSED_ATOL, msg=name)


def test_per_molecule_dropout_gives_the_cpu_step_on_cuda(molecules):  # noqa: F811 - the fixture
    """Per-molecule masks are a hash of the molecule's keys, exact on either device: a dropout-0.2 step on CUDA
    has the CPU step's loss and gradients up to float summation order (torch's RNG would draw other masks)."""
    settings = FinetuneStepSettings("regression", 0.1, dropout_draws="per_molecule", seed=4)
    results = {}
    for device in ("cpu", "cuda"):
        model = _model(0.2).to(device)
        optimizer, scheduler = _trainer(model)
        optimizer.step = lambda: None  # keep the step's gradients to compare them
        rows = np.arange(len(SMILES))
        batch = molecules.batch(rows, operators=model.kermt.aggregation_spec(training=True), global_rows=rows)
        with tf32(False):
            step = train_step(model, optimizer, scheduler, batch.to(device), settings, np.random.default_rng(3),
                              global_step=3)
        grads = {name: p.grad.cpu() for name, p in model.named_parameters() if p.grad is not None}
        results[device] = (float(step.objective_share), grads)
    (cpu_loss, cpu_grads), (cuda_loss, cuda_grads) = results["cpu"], results["cuda"]
    print(f"per-molecule dropout step: loss cpu {cpu_loss:.7f}, cuda {cuda_loss:.7f}")
    assert cuda_loss == pytest.approx(cpu_loss, rel=1e-5)
    assert sorted(cuda_grads) == sorted(cpu_grads)
    for name, grad in cpu_grads.items():
        scale = max(float(grad.abs().max()), 1e-3)
        torch.testing.assert_close(cuda_grads[name], grad, rtol=1e-3, atol=1e-4 * scale, msg=name)
