"""A worker's empty share of a global batch (0 molecules) goes through every code path.

With N workers the epoch's last global batch can leave a worker nothing (513 molecules, batch 32, 2 workers). That
worker must still run the forward and backward (DDP's collectives must match), so every path has to accept 0
molecules: features, readouts, heads, losses, the train step, prediction, metrics and the pretraining heads. The
loss of an empty share is 0 and every parameter gets a finite (zero) gradient.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.collate import collate_graphs
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from tests.kermt.loss_oracles import finetune_loss, pretrain_loss
from kermt.train.losses import LabelledTargets, eval_task_loss
from kermt.metrics import task_scores
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.fingerprint import KermtFingerprint
from kermt.nn.pretrain.config import PretrainLossConfig
from kermt.nn.pretrain.model import KermtPretrainModel, PretrainBatch
from kermt.nn.pretrain.vocab_heads import VocabTargets
from kermt.nn.readout import Readout
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer
from kermt.train.step import FinetuneStepSettings, predict, score, train_step, validation_loss
from tests.kermt.nn.pretrain.test_model import FIXTURE_ENCODER, fixture_heads

NONE = np.zeros(0, dtype=np.int64)
ENCODER = EncoderConfig(hidden_size=8, depth=3, num_attn_head=2, activation="PReLU")
FEATURES = 5


@pytest.fixture(scope="module")
def molecules() -> MoleculeSet:
    done = featurize_smiles(["CCO", "c1ccccc1O", "CC(=O)N"])
    features = np.arange(3 * FEATURES, dtype=np.float32).reshape(3, FEATURES) / 10
    targets = np.array([[0.5, 1.0], [np.nan, 0.0], [1.0, np.nan]], dtype=np.float32)
    return MoleculeSet(done.graphs, features, targets, done.smiles)


def _model(self_attention: bool, dataset_type: str = "regression", mtl: bool = False) -> KermtFinetuneModel:
    torch.manual_seed(0)
    head = HeadConfig(num_tasks=2, dataset_type=dataset_type, features_size=FEATURES, ffn_hidden_size=6,
                      ffn_num_task_specific_layers=1, ffn_task_specific_hidden_size=4)
    return KermtFinetuneModel(FinetuneModelConfig(ENCODER, ReadoutConfig(self_attention=self_attention), head, mtl))


def test_empty_batch_collates_to_the_padding_row_only(molecules):
    batch = molecules.batch(NONE)
    assert batch.graph.f_atoms.shape == (1, 151) and batch.graph.f_bonds.shape == (1, 165)
    assert batch.graph.a_scope.shape == (0, 2) and batch.features.shape == (0, FEATURES)
    assert batch.targets.shape == (0, 2)


@pytest.mark.parametrize("self_attention", [False, True])
def test_readout_of_no_molecules_is_empty(self_attention):
    readout = Readout(8, ReadoutConfig(self_attention=self_attention))
    pooled = readout(torch.randn(1, 8), torch.zeros(0, 2, dtype=torch.long))
    assert pooled.shape == (0, readout.output_size)


@pytest.mark.parametrize("self_attention", [False, True])
@pytest.mark.parametrize("dataset_type", ["regression", "classification"])
def test_finetune_forward_with_features_on_no_molecules(molecules, self_attention, dataset_type):
    model = _model(self_attention, dataset_type).train()
    batch = molecules.batch(NONE)
    out = model(batch.graph, batch.features, np.random.default_rng(0))
    assert out.readout_atom_view.shape == (0, model.readout.output_size)
    assert out.atom_view.shape == out.bond_view.shape == out.prediction.shape == (0, 2)


@pytest.mark.parametrize("mtl", [False, True])
def test_train_step_on_an_empty_share_is_a_zero_step(molecules, mtl):
    model = _model(True, mtl=mtl).train()
    optimizer = build_optimizer(model, 1e-3, 0.0, 1.0)
    scheduler = NoamLR(optimizer, NoamSchedule(1.0, 2, 1, 1e-3, 1e-3, 1e-3), 1.0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    step = train_step(model, optimizer, scheduler, molecules.batch(NONE), FinetuneStepSettings("regression", 0.1, mtl),
                      np.random.default_rng(0))
    assert step.label_loss_sum.item() == 0.0 and step.label_count.item() == 0.0
    for name, p in model.named_parameters():
        if name == "mtl_log_sigma":  # Σ log σ is in the objective whatever the batch: its gradient is 1
            torch.testing.assert_close(p.grad, torch.ones_like(p))
        elif p.requires_grad:
            # cleared (None) only for an encoder whose depth draw ran no iteration (DepthDrawLog)
            assert p.grad is not None or ".mpn_" in name, name
            assert p.grad is None or torch.count_nonzero(p.grad) == 0, name
            torch.testing.assert_close(p.detach(), before[name], rtol=0, atol=0)


def test_losses_of_no_labels_are_zero():
    empty = LabelledTargets.from_nan(torch.zeros(0, 2))
    atom = torch.zeros(0, 2, requires_grad=True)
    assert finetune_loss(atom, atom, empty, "regression", 0.1, empty.mask.sum()).item() == 0.0
    sigma = torch.tensor([0.5, -0.25])
    mtl = finetune_loss(atom, atom, empty, "classification", 0.1, empty.task_counts(), log_sigma=sigma)
    assert mtl.item() == pytest.approx(0.25)  # only Σ log σ remains
    assert eval_task_loss(torch.zeros(0, 2), empty, "regression").tolist() == [0.0, 0.0]


def test_prediction_and_scores_of_no_molecules(molecules):
    model = _model(False)
    assert predict(model, molecules, NONE, 4).shape == (0, 2)
    none = np.zeros((0, 2))
    assert np.isnan(task_scores(none, none, "rmse", "regression")).all()
    assert np.isnan(task_scores(none, none, "auc", "classification")).all()
    assert np.isnan(score(none, none, "mae", "regression", None)[0])
    assert np.isnan(validation_loss(none, none, 4, "regression"))


def test_fingerprint_with_features_of_no_molecules(molecules):
    torch.manual_seed(0)
    fingerprint = KermtFingerprint(_model(False).kermt.__class__(replace(ENCODER, embedding_output_type="both")))
    batch = molecules.batch(NONE)
    assert fingerprint(batch.graph, batch.features).shape == (0, 4 * 8 + FEATURES)


@pytest.mark.parametrize("mode", ["vocab", "cmim", "hybrid"])
def test_pretrain_loss_of_no_molecules_is_zero_with_zero_gradients(mode):
    torch.manual_seed(0)
    model = KermtPretrainModel(replace(FIXTURE_ENCODER, depth=6), fixture_heads(mode)).train()
    graph = collate_graphs(featurize_smiles(["CCO"]).graphs.select(NONE))
    padding_label = torch.zeros(1, dtype=torch.long)  # the padding row is never labelled
    batch = PretrainBatch(graph, VocabTargets(padding_label, padding_label, torch.zeros(0, 85)),
                          torch.zeros(0, 6, dtype=torch.long))
    loss = pretrain_loss(model(batch, generator=torch.Generator().manual_seed(0)), batch, model.heads_config,
                         PretrainLossConfig())
    assert all(value == 0.0 for value in loss.scalars().values()), loss.scalars()
    loss.total.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert [n for n, p in trainable if p.grad is None] == []
    assert all(torch.count_nonzero(p.grad) == 0 for _, p in trainable)
