"""The pretraining step: one process equals upstream's batch means; two gloo processes with batch b equal one
process with batch 2b (real torch.distributed, real DDP), in every mode, with a worker whose share is empty."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from kermt.data.sampling import epoch_order, global_batches
from kermt.nn.depth import depth_rng
from kermt.nn.pretrain_config import PretrainLossConfig
from kermt.nn.pretrain_loss import pretrain_loss
from kermt.nn.pretrain_model import KermtPretrainModel
from kermt.pretrain.batch import build_step_batch
from kermt.pretrain.loss import GlobalView, pretrain_shares
from kermt.pretrain.step import Distribution, PretrainStep, StepSettings, all_gather_with_grad
from tests.conftest import free_port
from tests.kermt.pretrain.tiny_corpus import TINY_ENCODER, fixture_smiles, tiny_arrays, tiny_heads

MODES = ("vocab", "cmim", "hybrid")
GLOBAL_BATCH = 5  # 26 molecules: five batches of 5 (split 3 + 2) and one of 1 (worker 1's share is empty)
SEED = 7
# Parameters whose exact gradient is 0, so Adam turns float noise into lr-sized steps: the attention key bias
# (softmax is invariant to it) and the decoder's cross-attention query/key (one memory token: the weight is 1).
NULL_GRADIENT = ("attn.linear_layers.1.bias", "cross_attn_q.", "cross_attn_k.")


@pytest.mark.parametrize("mode", MODES)
def test_one_process_shares_equal_upstream_batch_means(mode: str) -> None:
    arrays, sizes = tiny_arrays(fixture_smiles())
    heads = tiny_heads(mode, sizes)
    torch.manual_seed(0)
    model = KermtPretrainModel(TINY_ENCODER, heads)
    step = build_step_batch(arrays, np.arange(9), 0, 1, heads, SEED, 0)
    output = model(step.batch, depth_rng=depth_rng(SEED, 0))
    view = GlobalView(step.counts.float(), True, output.z, 0)
    shares = pretrain_shares(output, step.batch.vocab_targets, view, heads, PretrainLossConfig())
    expected = pretrain_loss(output, step.batch, heads, PretrainLossConfig())
    assert float(shares["loss"].detach()) == pytest.approx(float(expected.total.detach()), rel=1e-6)
    logged = expected.scalars()
    for name, value in shares.items():
        upstream_name = {"av": "av_loss", "bv": "bv_loss", "fg": "fg_loss", "av_dist": "av_dist_loss",
                         "bv_dist": "bv_dist_loss", "fg_dist": "fg_dist_loss", "recon": "recon_loss",
                         "cmim": "cmim_loss", "vocab_total": "vocab_loss"}.get(name, name)
        assert float(value.detach()) == pytest.approx(logged[upstream_name], rel=1e-5, abs=1e-7), name


def _train(mode: str, rank: int, world: int, steps: int | None = None) -> dict[str, torch.Tensor]:
    """Train one epoch (global batch GLOBAL_BATCH) on this rank; returns the final parameters."""
    torch.set_num_threads(1)
    arrays, sizes = tiny_arrays(fixture_smiles())
    heads = tiny_heads(mode, sizes)
    torch.manual_seed(0)
    model = KermtPretrainModel(TINY_ENCODER, heads)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    distribution = Distribution()
    wrapped: torch.nn.Module = model
    if world > 1:
        wrapped = DistributedDataParallel(model)
        distribution = Distribution(world, rank, _all_reduce, all_gather_with_grad(dist.new_group()))
    trainer = PretrainStep(wrapped, optimizer, scheduler, StepSettings(SEED), distribution)
    batches = global_batches(epoch_order(len(arrays), SEED, 0), GLOBAL_BATCH)
    for global_step, rows in enumerate(batches[:steps]):
        trainer.train(build_step_batch(arrays, rows, rank, world, heads, SEED, global_step), global_step)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor)
    return tensor


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = {mode: _train(mode, rank, world) for mode in MODES}
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def test_two_gloo_workers_equal_one_process(tmp_path: Path) -> None:
    out = tmp_path / "two_workers.pt"
    mp.spawn(_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    two = torch.load(out, weights_only=True)
    for mode in MODES:
        one = _train(mode, 0, 1)
        torch.manual_seed(0)
        start = KermtPretrainModel(TINY_ENCODER, tiny_heads(mode, tiny_arrays(fixture_smiles())[1]))
        moved = 0
        for name, value in one.items():
            if any(part in name for part in NULL_GRADIENT):
                continue
            torch.testing.assert_close(two[mode][name], value, rtol=0, atol=1e-6, msg=f"{mode}: {name}")
            moved += int(not torch.equal(value, dict(start.named_parameters())[name].detach()))
        assert moved > len(one) // 2, f"{mode}: training should move most parameters"
