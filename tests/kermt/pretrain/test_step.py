"""The pretraining step: one process equals upstream's batch means; two gloo processes with batch b equal one
process with batch 2b (real torch.distributed, real DDP), in every mode, with a worker whose share is empty, and in
hybrid mode with encoder and decoder dropout drawn per molecule; with ``per_rank_means`` they equal upstream's DDP
semantics (each rank's own batch means, gradients averaged)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from kermt.data.operators import operators_of
from kermt.data.sampling import epoch_order, global_batches
from kermt.random_streams import depth_rng
from bench.dispatch_audit import DispatchAudit, optimizer_host_tensors
from kermt.nn.encoder import DepthDrawLog
from kermt.nn.pretrain.config import PretrainLossConfig
from tests.kermt.loss_oracles import pretrain_loss
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.pretrain.batch import build_step_batch
from kermt.pretrain.loss import GlobalView, pretrain_shares
from kermt.pretrain.step import Distribution, PretrainStep, PretrainStepSettings, all_gather_with_grad
from tests.conftest import free_port
from tests.gloo import gloo_group
from tests.kermt.pretrain.tiny_corpus import TINY_ENCODER, fixture_smiles, tiny_arrays, tiny_heads

MODES = ("vocab", "cmim", "hybrid")
GLOBAL_BATCH = 5  # 26 molecules: five batches of 5 (split 3 + 2) and one of 1 (worker 1's share is empty)
SEED = 7
DROPOUT = 0.2
# Parameters whose exact gradient is 0, so Adam turns float noise into lr-sized steps: the attention key biases of
# the encoder and of the decoder's self-attention (softmax is invariant to them) and the decoder's cross-attention
# query/key (one memory token: the weight is 1).
NULL_GRADIENT = ("attn.linear_layers.1.bias", "self_attn_k.bias", "cross_attn_q.", "cross_attn_k.")


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


def _setup(mode: str, dropout: float = 0.0) -> tuple:
    torch.set_num_threads(1)
    arrays, sizes = tiny_arrays(fixture_smiles())
    heads = dataclasses.replace(tiny_heads(mode, sizes), decoder_dropout=dropout)
    torch.manual_seed(0)
    model = KermtPretrainModel(dataclasses.replace(TINY_ENCODER, dropout=dropout), heads)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = global_batches(epoch_order(len(arrays), SEED, 0), GLOBAL_BATCH)
    return arrays, heads, model, optimizer, batches


def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train(mode: str, rank: int, world: int, per_rank_means: bool = False,
           dropout: float = 0.0) -> dict[str, torch.Tensor]:
    """Train one epoch (global batch GLOBAL_BATCH) on this rank; returns the final parameters. With ``dropout``,
    the encoder and the decoder drop at that rate, drawn per molecule."""
    arrays, heads, model, optimizer, batches = _setup(mode, dropout)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    distribution = Distribution()
    wrapped: torch.nn.Module = model
    if world > 1:
        wrapped = DistributedDataParallel(model)
        distribution = Distribution(world, rank, all_gather_with_grad(dist.new_group()))
    settings = PretrainStepSettings(SEED, per_rank_means=per_rank_means,
                                    dropout_draws="per_molecule" if dropout else "torch")
    trainer = PretrainStep(wrapped, optimizer, scheduler, settings, distribution)
    for global_step, rows in enumerate(batches):
        trainer.train(build_step_batch(arrays, rows, rank, world, heads, SEED, global_step), global_step)
    return _parameters(model)


def _upstream_two_ranks_in_one_process(mode: str) -> dict[str, torch.Tensor]:
    """Upstream's DDP semantics, simulated: each rank's loss is kermt.nn's batch means over its own share
    (negatives included), and the gradient is the average of the two ranks' gradients. Encoders that a step's
    depth draw left idle get no gradient, so Adam skips them, as upstream's does."""
    arrays, heads, model, optimizer, batches = _setup(mode)
    for global_step, rows in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        with DepthDrawLog() as draws:
            for rank in (0, 1):
                batch = build_step_batch(arrays, rows, rank, 2, heads, SEED, global_step).batch
                output = model(batch, depth_rng=depth_rng(SEED, global_step))
                loss = pretrain_loss(output, batch, heads, PretrainLossConfig()).total / 2
                (loss + 0.0 * sum(p.sum() for p in model.parameters())).backward()
        draws.skip_idle()
        optimizer.step()
    return _parameters(model)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    with gloo_group(rank, world, port):
        result = {mode: _train(mode, rank, world) for mode in MODES}
        result["per_rank"] = _train("hybrid", rank, world, per_rank_means=True)
        result["dropout"] = _train("hybrid", rank, world, dropout=DROPOUT)
        if rank == 0:
            torch.save(result, out)


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
    with_dropout, without = _train("hybrid", 0, 1, dropout=DROPOUT), _train("hybrid", 0, 1)
    for name, value in with_dropout.items():
        if not any(part in name for part in NULL_GRADIENT):
            torch.testing.assert_close(two["dropout"][name], value, rtol=0, atol=1e-6, msg=f"dropout: {name}")
    assert sum(not torch.allclose(value, without[name], atol=1e-4) for name, value in with_dropout.items()) > 10
    upstream = _upstream_two_ranks_in_one_process("hybrid")
    for name, value in upstream.items():
        if not any(part in name for part in NULL_GRADIENT):
            # 1e-5: the simulation sums the ranks' gradients by accumulation, DDP by all-reduce (seen: 2e-6)
            torch.testing.assert_close(two["per_rank"][name], value, rtol=0, atol=1e-5, msg=f"per rank: {name}")


@pytest.mark.parametrize("mode", MODES)
def test_operators_built_with_the_batch_change_no_number(mode: str) -> None:
    """The runner builds each batch's neighbour-sum operators on the host, with the batch, so that a step on a GPU
    never builds them itself (a host round trip per operator). Steps on such batches give exactly the numbers of
    batches without them (the encoder then derives them from the index arrays)."""
    params = {}
    for collated in (False, True):
        arrays, heads, model, optimizer, batches = _setup(mode, DROPOUT)
        spec = model.encoder.aggregation_spec(training=True) if collated else None
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        trainer = PretrainStep(model, optimizer, scheduler, PretrainStepSettings(SEED, dropout_draws="per_molecule"))
        for global_step, rows in enumerate(batches[:3]):
            step = build_step_batch(arrays, rows, 0, 1, heads, SEED, global_step, operators=spec)
            if collated:
                operators = step.batch.graph.operators
                assert set(operators.matrices) == set(operators.transposes) == set(spec.names)
            trainer.train(step, global_step)
        params[collated] = _parameters(model)
    for name, value in params[False].items():
        assert torch.equal(params[True][name], value), name


def test_a_workers_operators_use_the_global_batchs_neighbour_width() -> None:
    """With upstream's padding every empty neighbour slot sums the padding row, so a worker's operators must be
    those of its share padded to the whole global batch's largest in-degree, as its index arrays are."""
    arrays, sizes = tiny_arrays(fixture_smiles())
    heads = tiny_heads("vocab", sizes)
    spec = KermtPretrainModel(TINY_ENCODER, heads).encoder.aggregation_spec(training=True)
    rows = np.arange(len(arrays))
    widths = set()
    for rank in (0, 1, 2):
        graph = build_step_batch(arrays, rows, rank, 3, heads, SEED, 0, operators=spec).batch.graph
        derived = operators_of(dataclasses.replace(graph, operators=None), spec)
        widths.add(graph.a2b.shape[1])
        for kind in ("matrices", "transposes"):
            for name, built in getattr(graph.operators, kind).items():
                expected = getattr(derived, kind)[name]
                assert built.shape == expected.shape
                for part in ("crow", "col", "values"):
                    assert torch.equal(getattr(built, part), getattr(expected, part)), (rank, kind, name, part)
    assert len(widths) == 1  # every share is padded to the global width...
    own_widths = {int(arrays.max_in_degree[share].max()) for share in np.array_split(rows, 3)}
    assert len(own_widths) > 1  # ...which is wider than some share's own


@pytest.mark.parametrize("mode", MODES)
def test_a_pretraining_step_reads_nothing_back(mode: str) -> None:
    """Counted with bench.dispatch_audit on the CPU (the dispatcher sees the ops a GPU runs): a step on a
    batch built with its operators needs no value or data-dependent shape from the device. The cMIM negatives
    (each molecule against the others) are a gather, not a boolean-mask selection, whose size the host would wait
    for."""
    arrays, heads, model, optimizer, batches = _setup(mode, DROPOUT)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trainer = PretrainStep(model, optimizer, scheduler, PretrainStepSettings(SEED, dropout_draws="per_molecule"))
    spec = model.encoder.aggregation_spec(training=True)
    for global_step, rows in enumerate(batches[:3]):
        step = build_step_batch(arrays, rows, 0, 1, heads, SEED, global_step, operators=spec)
        with DispatchAudit(optimizer_host_tensors(optimizer)) as audit:
            trainer.train(step, global_step)
        assert audit.sync_count == 0, (global_step, audit.syncs)


@pytest.mark.parametrize("mode", MODES)
def test_a_bf16_step_stays_near_the_fp32_step(mode: str) -> None:
    """``precision="bf16"``: the forward under bfloat16 autocast, the losses on float32 copies of its outputs.
    Measured on this fixture (hidden 16 and 128): every term of a step within 1e-3 relative of fp32's, the loss
    after 3 steps too; bf16 keeps 8 bits of mantissa (4e-3 relative per rounding), so the bound is 1e-2."""
    results = {}
    for precision in ("fp32", "bf16"):
        arrays, heads, model, optimizer, batches = _setup(mode)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        settings = PretrainStepSettings(SEED, dropout_draws="per_molecule", precision=precision)
        trainer = PretrainStep(model, optimizer, scheduler, settings)
        spec = model.encoder.aggregation_spec(training=True)
        shares = [trainer.train(build_step_batch(arrays, rows, 0, 1, heads, SEED, step, operators=spec), step)
                  for step, rows in enumerate(batches[:3])]
        assert all(value.dtype == torch.float32 for value in shares[0].values())
        results[precision] = [{name: float(value) for name, value in step.items()} for step in shares]
    fp32, bf16 = results["fp32"], results["bf16"]
    for name, value in fp32[0].items():
        assert bf16[0][name] == pytest.approx(value, rel=1e-2, abs=1e-4), name
    assert bf16[-1]["loss"] == pytest.approx(fp32[-1]["loss"], rel=1e-2)
    assert any(bf16[0][name] != value for name, value in fp32[0].items())  # the forward did run in bf16
