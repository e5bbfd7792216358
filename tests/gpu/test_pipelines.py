"""Pretraining and screening on CUDA as their runners feed them: batches built on the host with their operators,
pinned and copied by ``kermt.data.prefetch``. A pretraining step never waits for the device; predictions and
embeddings launched batch after batch (``kermt.inference.batches``) equal the CPU's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kermt.checkpoint import read_checkpoint
from kermt.data.featurize import featurize_smiles
from kermt.data.prefetch import prefetch
from kermt.inference import Embedder, Ensemble, InferenceBatch, plan_features, read_members
from bench.dispatch_audit import DispatchAudit, optimizer_host_tensors
from kermt.train.optim import build_optimizer
from kermt.pretrain.batch import build_step_batch
from kermt.pretrain.step import PretrainStep, PretrainStepSettings
from tests.conftest import FIXTURE_DIR
from tests.gpu.cuda import GPU_LANE, tf32
from tests.kermt.pretrain.test_step import DROPOUT, MODES, SEED, _setup
from tests.kermt.test_inference import SMILES

pytestmark = GPU_LANE

PREDICT_ATOL = 1e-5  # the same weights on either device: float summation order only (as tests/gpu/test_ray_runs.py)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", MODES)
def test_a_cuda_pretraining_step_never_synchronises(mode: str, precision: str) -> None:
    arrays, heads, model, _, batches = _setup(mode, DROPOUT)
    model.cuda()
    optimizer = build_optimizer(model, 1e-4, 0.0, 1.0)  # fused on CUDA, as the runner's
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    settings = PretrainStepSettings(SEED, dropout_draws="per_molecule", precision=precision)
    trainer = PretrainStep(model, optimizer, scheduler, settings)
    spec = model.encoder.aggregation_spec(training=True)
    built = (build_step_batch(arrays, rows, 0, 1, heads, SEED, step, operators=spec)
             for step, rows in enumerate(batches[:4]))
    steps = prefetch(built, "cuda")
    trainer.train(next(steps), 0)  # Adam's state created
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with DispatchAudit(optimizer_host_tensors(optimizer)) as audit:
            for global_step, step in enumerate(steps, start=1):
                shares = trainer.train(step, global_step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert audit.sync_count == 0, audit.syncs
    assert shares["loss"].is_cuda and torch.isfinite(shares["loss"]).item()


def _on(device: str):
    members = read_members([FIXTURE_DIR / "ckpt_ft_reg.pt", FIXTURE_DIR / "ckpt_ft_reg_ts.pt"])
    embedder = Embedder(read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt"), device)
    return Ensemble(members, device), embedder, plan_features([m.spec for m in members]).generator


def test_screening_on_cuda_gives_the_cpu_numbers_without_waiting_inside_a_batch() -> None:
    smiles = SMILES + ["not a smiles"] + SMILES[:9]
    results = {}
    for device in ("cpu", "cuda"):
        ensemble, embedder, generator = _on(device)
        with tf32(False):
            prediction = ensemble.predict(featurize_smiles(smiles, generator), batch_size=8)
            outputs = embedder.outputs(featurize_smiles(smiles), 8, None)
        results[device] = (prediction.mean, outputs)
    (cpu_mean, cpu_outputs), (cuda_mean, cuda_outputs) = results["cpu"], results["cuda"]
    np.testing.assert_allclose(cuda_mean, cpu_mean, rtol=0, atol=PREDICT_ATOL)
    for (cpu_rows, cpu_values), (cuda_rows, cuda_values) in zip(cpu_outputs, cuda_outputs, strict=True):
        np.testing.assert_array_equal(cuda_rows, cpu_rows)
        for name, values in cpu_values.items():
            np.testing.assert_allclose(cuda_values[name], values, rtol=0, atol=PREDICT_ATOL, err_msg=name)
    ensemble, _, generator = _on("cuda")
    molecules = featurize_smiles(SMILES, generator)
    batch = InferenceBatch(np.arange(len(SMILES)), molecules.batch_graph(ensemble.operators),
                           ensemble._member_features(molecules)).pin_memory().to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with DispatchAudit() as audit:
            launched = ensemble._launch(batch)  # the forward of every member; only the read-back waits
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert audit.sync_count == 0, audit.syncs
    assert launched.is_cuda
