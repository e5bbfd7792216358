"""Every tensor the library makes inside a training step, a forward or a prediction lives where its inputs live.

A tensor made without an explicit device lands on the default device, the CPU, even when the model and batch are on
a GPU: then the step fails ("Expected all tensors to be on the same device") or, for a mix the op tolerates, copies
through the host. This is checked without a GPU: inside ``with torch.device("meta")`` every tensor made without a
device lands on the meta device instead, and the first op that mixes it with the CPU model and batch fails. Each
case runs once outside and once inside that context and must give the same numbers (the context changes nothing
for code that places its tensors). Before this test, ``_in_encoder_order`` made its gather index on the default
device and the CSR operators took theirs from the context; both now name the device.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
import torch

from kermt.checkpoint import read_checkpoint
from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from kermt.data.sampling import epoch_order, global_batches
from kermt.inference import Embedder, Ensemble, plan_features, read_members
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.pretrain.model import KermtPretrainModel
from kermt.train.optim import NoamLR, NoamSchedule
from kermt.pretrain.batch import build_step_batch
from kermt.pretrain.step import PretrainStep
from kermt.pretrain.step import PretrainStepSettings
from kermt.train.step import FinetuneStepSettings, predict, train_step
from tests.conftest import FIXTURE_DIR
from tests.kermt.pretrain.tiny_corpus import TINY_ENCODER, fixture_smiles, tiny_arrays, tiny_heads

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccccc1", "C1CCNCC1", "OC(=O)C(N)Cc1ccccc1", "N#Cc1ccncc1"]
TARGETS = np.array([[0.5, 1.0], [np.nan, 0.0], [1.0, np.nan], [0.2, 0.3], [np.nan, np.nan], [0.7, 0.0]],
                   dtype=np.float32)
STEPS = 3


def _context(placed_by_default: bool) -> contextlib.AbstractContextManager:
    """Tensors made without a device go to the meta device (inside) or to the CPU (outside)."""
    return torch.device("meta") if placed_by_default else contextlib.nullcontext()


def _molecules(features: int) -> MoleculeSet:
    done = featurize_smiles(SMILES)
    extra = np.random.default_rng(0).normal(size=(len(SMILES), features)).astype(np.float32) if features else None
    return MoleculeSet(done.graphs, extra, TARGETS.copy(), done.smiles)


FINETUNE_CASES = {
    "attention_dropout_torch_mtl": (EncoderConfig(hidden_size=8, depth=3, num_attn_head=2, dropout=0.2),
                                    ReadoutConfig(self_attention=True), "regression", 0, "fp32", "torch", True),
    "keyed_dropout_bf16_features": (EncoderConfig(hidden_size=8, depth=3, num_attn_head=2, dropout=0.2),
                                    ReadoutConfig(self_attention=False), "regression", 3, "bf16", "per_molecule",
                                    False),
    "zero_padding_bias_elu_two_blocks_classification": (
        EncoderConfig(hidden_size=8, depth=2, num_attn_head=2, num_mt_block=2, activation="ELU", bias=True,
                      padding="zero"),
        ReadoutConfig(self_attention=True), "classification", 2, "fp32", "torch", False),
}


def _finetune(case: str, placed_by_default: bool) -> list[torch.Tensor]:
    """STEPS optimizer steps on 4 of the 6 molecules (the other 2 counted as another rank's), then a prediction of
    all 6: the losses, the final parameters and the predictions. Adam is the fused one (its state follows the
    parameters' device; the default one keeps its step counters on the host by design)."""
    encoder, readout, dataset_type, features, precision, draws, mtl = FINETUNE_CASES[case]
    molecules = _molecules(features)
    if dataset_type == "classification":
        molecules = dataclasses.replace(molecules, targets=np.where(np.isnan(TARGETS), np.nan, TARGETS > 0.4)
                                        .astype(np.float32))
    torch.manual_seed(0)
    head = HeadConfig(num_tasks=2, dataset_type=dataset_type, features_size=features, ffn_hidden_size=6,
                      dropout=encoder.dropout)
    model = KermtFinetuneModel(FinetuneModelConfig(dataclasses.replace(encoder, embedding_output_type="atom"),
                                                   readout, head, mtl))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    scheduler = NoamLR(optimizer, NoamSchedule(1.0, 4, 2, 1e-3, 1e-2, 1e-3))
    settings = FinetuneStepSettings(dataset_type, 0.1, mtl, precision, draws, seed=5)
    spec = model.kermt.aggregation_spec(training=True)
    batch = molecules.batch(np.arange(4), operators=spec, global_rows=np.arange(len(SMILES)))
    results = []
    with _context(placed_by_default):
        for step in range(STEPS):
            done = train_step(model, optimizer, scheduler, batch, settings, np.random.default_rng(step), 2,
                              global_step=step)
            results += [done.label_loss_sum, done.objective_share]
        predictions = predict(model, molecules, np.arange(len(SMILES)), 4, precision=precision)
    return results + [p.detach().clone() for p in model.parameters()] + [torch.from_numpy(predictions)]


@pytest.mark.parametrize("case", list(FINETUNE_CASES))
def test_finetune_steps_and_predictions_place_every_tensor(case: str) -> None:
    _assert_same(_finetune(case, False), _finetune(case, True))


def _pretrain(mode: str, placed_by_default: bool) -> list[torch.Tensor]:
    arrays, sizes = tiny_arrays(fixture_smiles())
    heads = dataclasses.replace(tiny_heads(mode, sizes), decoder_dropout=0.1)
    torch.manual_seed(0)
    model = KermtPretrainModel(dataclasses.replace(TINY_ENCODER, dropout=0.1), heads)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trainer = PretrainStep(model, optimizer, scheduler, PretrainStepSettings(7, dropout_draws="per_molecule"))
    shares = []
    for global_step, rows in enumerate(global_batches(epoch_order(len(arrays), 7, 0), 5)[:STEPS]):
        step = build_step_batch(arrays, rows, 0, 1, heads, 7, global_step)  # the data loader's side: not audited
        with _context(placed_by_default):
            shares += list(trainer.train(step, global_step).values())
    return shares + [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["vocab", "cmim", "hybrid"])
def test_pretraining_steps_place_every_tensor(mode: str) -> None:
    _assert_same(_pretrain(mode, False), _pretrain(mode, True))


def _inference(placed_by_default: bool) -> list[np.ndarray]:
    members = read_members([FIXTURE_DIR / "ckpt_ft_reg.pt", FIXTURE_DIR / "ckpt_ft_reg_ts.pt"])
    molecules = featurize_smiles(SMILES + ["not a smiles"], plan_features([m.spec for m in members]).generator)
    ensemble = Ensemble(members)
    embedder = Embedder(read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_hybrid.pt"))
    with _context(placed_by_default):
        prediction = ensemble.predict(molecules, batch_size=4)
        valid = molecules.select(np.flatnonzero(molecules.valid))
        embeddings = embedder.embeddings(valid)
        fingerprints = embedder.fingerprints(valid, "both")
    return [prediction.mean, *embeddings.values(), fingerprints]


def test_predictions_and_embeddings_place_every_tensor() -> None:
    outside, inside = _inference(False), _inference(True)
    assert len(outside) == len(inside)
    for expected, actual in zip(outside, inside):
        np.testing.assert_array_equal(actual, expected)


def _assert_same(outside: list[torch.Tensor], inside: list[torch.Tensor]) -> None:
    assert len(outside) == len(inside)
    for expected, actual in zip(outside, inside):
        assert actual.device.type == "cpu"
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
