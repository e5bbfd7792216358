"""A forward and a training step ask nothing back from the device: no value read, no data-dependent shape, no
collective for the label count, when the batch comes from the collate with the model's operators and its global
batch's label counts. Counted with bench.dispatch_audit on CPU: the dispatcher sees the same ops a GPU runs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from bench.dispatch_audit import DispatchAudit, optimizer_host_tensors
from kermt.nn.finetune import KermtFinetuneModel
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer
from kermt.train.step import FinetuneStepSettings, train_step

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccccc1", "C1CCNCC1", "OC(=O)C(N)Cc1ccccc1"]


@pytest.fixture(scope="module")
def molecules() -> MoleculeSet:
    done = featurize_smiles(SMILES)
    targets = np.array([[0.5, 1.0], [np.nan, 0.0], [1.0, np.nan], [0.2, 0.3], [np.nan, np.nan]], dtype=np.float32)
    return MoleculeSet(done.graphs, None, targets, done.smiles)


def _model(dropout: float = 0.0, mtl: bool = False) -> KermtFinetuneModel:
    torch.manual_seed(0)
    encoder = EncoderConfig(hidden_size=8, depth=3, num_attn_head=2, activation="PReLU", dropout=dropout)
    head = HeadConfig(num_tasks=2, dataset_type="regression", ffn_hidden_size=6, dropout=dropout)
    return KermtFinetuneModel(FinetuneModelConfig(encoder, ReadoutConfig(self_attention=True), head, mtl))


def _trainer(model):
    optimizer = build_optimizer(model, 1e-3, 0.0, 1.0)
    return optimizer, NoamLR(optimizer, NoamSchedule(1.0, 4, 2, 1e-3, 1e-2, 1e-3))


def test_an_eval_forward_reads_nothing_back(molecules):
    model = _model().eval()
    rows = np.arange(len(SMILES))
    batch = molecules.batch(rows, operators=model.kermt.aggregation_spec(training=False))
    with torch.no_grad(), DispatchAudit() as audit:
        model(batch.graph, batch.features)
    assert audit.sync_count == 0, audit.syncs
    # the audit does see a read-back: without the collate's widths, the readout (one for both views) asks for
    # its padded width
    with torch.no_grad(), DispatchAudit() as audit:
        model(replace(batch.graph, max_atoms=None), batch.features)
    assert audit.syncs == {"aten._local_scalar_dense": 1}


@pytest.mark.parametrize("mtl", [False, True])
@pytest.mark.parametrize(("dropout", "draws"), [(0.0, "torch"), (0.2, "torch"), (0.2, "per_molecule")],
                         ids=["stacked", "loop", "keyed_stacked"])
def test_a_train_step_reads_nothing_back_and_needs_no_collective(molecules, mtl, dropout, draws):
    global_rows, rows = np.arange(len(SMILES)), np.arange(3)  # this worker's share of the global batch
    results, collectives = {}, []

    def all_reduce(counts):  # stands in for the sum over ranks: the host-counted labels of the other rows
        collectives.append(counts)
        other = ~np.isnan(molecules.targets[3:])
        return counts + torch.from_numpy((other.sum(0) if mtl else other.sum().reshape(1)).astype(np.float32))

    for counted_on_host in (True, False):
        model = _model(dropout, mtl)
        optimizer, scheduler = _trainer(model)
        settings = FinetuneStepSettings("regression", 0.1, mtl, dropout_draws=draws, seed=4)
        spec = model.kermt.aggregation_spec(training=True)
        batch = molecules.batch(rows, operators=spec, global_rows=global_rows if counted_on_host else None)
        steps = []
        for step in range(2):  # the second step: Adam's state exists (steady state)
            torch.manual_seed(step)
            with DispatchAudit(optimizer_host_tensors(optimizer)) as audit:
                steps.append(train_step(model, optimizer, scheduler, batch, settings,
                                        np.random.default_rng(step), 2, all_reduce, global_step=step))
        results[counted_on_host] = (steps, [p.detach().clone() for p in model.parameters()])
        if counted_on_host:
            assert audit.sync_count == 0, audit.syncs
            assert not collectives
    assert len(collectives) == 2  # the step without host counts asked for them, once per step
    (host_steps, host_params), (reduced_steps, reduced_params) = results[True], results[False]
    for host, reduced in zip(host_steps, reduced_steps):
        assert torch.equal(host.label_count, reduced.label_count) and host.label_count.item() == 6
        assert torch.equal(host.objective_share, reduced.objective_share)
    for host, reduced in zip(host_params, reduced_params):
        assert torch.equal(host, reduced)
