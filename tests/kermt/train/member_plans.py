"""A small member to train (60 molecules of the sample data, the fixture pretrained encoder, 3 regression tasks with
many missing labels) and the checks that two trainings of it agree: shared by the loop's tests without Ray
(tests/kermt/train/test_loop.py) and on Ray Train (tests/ray_app/finetune/test_train_loop.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kermt.checkpoint import load_into_model, read_checkpoint
from kermt.checkpoint.reader import FRESH_HEAD_PREFIXES
from kermt.config import FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from kermt.data.sampling import epoch_order, global_batches
from kermt.data.scalers import StandardScaler
from kermt.data.tables import load_molecule_table
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.heads import initialize_weights
from kermt.random_streams import depth_rng
from kermt.train.loop import MemberPlan
from tests.conftest import DATA_DIR, FIXTURE_DIR

ROOT = DATA_DIR.parents[1]
# The key projection's bias in the attention across heads adds q.b to every score of a query: softmax ignores it,
# so its true gradient is 0 and Adam turns float rounding noise (which differs with batch split) into full steps.
SHIFT_INVARIANT = ("attn.linear_layers.1.bias",)


def _molecule_set(smiles: list[str], targets: np.ndarray, scaler: StandardScaler,
                  features_generator: tuple[str, ...] = ()) -> MoleculeSet:
    done = featurize_smiles(smiles, features_generator)
    assert done.valid.all()
    features = done.features.astype(np.float32) if features_generator else None
    return MoleculeSet(done.graphs, features, scaler.transform(targets).astype(np.float32), done.smiles)


def member_plan(global_batch_size: int, padding: str, epochs: int = 2, use_mtl_loss: bool = False, n_train: int = 44,
                features_generator: tuple[str, ...] = (), dropout: float = 0.2, variance: bool = False) -> MemberPlan:
    table = load_molecule_table(ROOT / "data/sample/admet_demo.csv", max_rows=60)
    train_y, val_y = table.targets[:n_train], table.targets[44:]
    assert np.isnan(train_y).sum() > 10  # many missing labels: the global label count matters
    scaler = StandardScaler.fit(train_y)
    ckpt = read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")
    encoder = dataclasses.replace(ckpt.spec.encoder, dropout=dropout, padding=padding)
    features_size = 200 * len(features_generator)  # rdkit_2d_normalized only, here
    config = FinetuneModelConfig(encoder, ReadoutConfig(self_attention=True),
                                 HeadConfig(num_tasks=3, dataset_type="regression", ffn_hidden_size=12,
                                            features_size=features_size, activation=encoder.activation,
                                            dropout=dropout, variance=variance),
                                 use_mtl_loss)
    torch.manual_seed(0)
    model = KermtFinetuneModel(config)
    for name, module in model.named_children():
        if name != "kermt":
            initialize_weights(module)
    load_into_model(model, ckpt.state_dict, FRESH_HEAD_PREFIXES, ckpt.ignored_entries())
    return MemberPlan(
        model_config=config, initial_state=model.state_dict(),
        train=_molecule_set(table.smiles[:n_train], train_y, scaler, features_generator),
        val=_molecule_set(table.smiles[44:], val_y, scaler, features_generator),
        target_scaler=scaler, seed=4, epochs=epochs, global_batch_size=global_batch_size, init_lr=1e-3, max_lr=3e-3,
        final_lr=5e-4, warmup_epochs=1.0, weight_decay=0.0, fine_tune_coff=0.5, dist_coff=0.15, bond_drop_rate=0.2,
        metric="rmse", select_by_loss=False, early_stop_epoch=100, label="model", precision="fp32",
        dropout_draws="per_molecule",
    )


def assert_only_shift_invariant_noise(plan: MemberPlan) -> None:
    """The 1-vs-2-rank comparison at float-noise tolerance needs a run in which only the key biases are moved by
    rounding noise alone: some depth draws give whole query/key paths an exact gradient of 0 for a step, and Adam
    turns their float noise (which differs with the batch split) into lr-sized steps that every later step then
    carries. The plan's seed is chosen so that no step draws that; this checks it."""
    noise_driven = _noise_driven(plan)
    assert noise_driven and all(name.endswith(SHIFT_INVARIANT) for name in noise_driven), sorted(noise_driven)


def _noise_driven(plan: MemberPlan) -> set[str]:
    """Parameters whose exact gradient is 0 at some step of the run, but not their float gradient. Found on the
    starting weights with the run's own batches and depth draws: a float gradient below 1e-6 of the step's
    largest."""
    model = KermtFinetuneModel(plan.model_config)
    model.load_state_dict(plan.initial_state)
    model.train()
    found, step = set(), 0
    for epoch in range(plan.epochs):
        for rows in global_batches(epoch_order(len(plan.train), plan.seed, epoch), plan.global_batch_size):
            batch = plan.train.batch(rows)
            model.zero_grad(set_to_none=True)
            out = model(batch.graph, batch.features, depth_rng(plan.seed, step))
            (out.atom_view.sum() + out.bond_view.sum()).backward()
            grads = {n: float(p.grad.abs().max()) for n, p in model.named_parameters() if p.grad is not None}
            found |= {n for n, g in grads.items() if 0 < g < 1e-6 * max(grads.values())}
            step += 1
    return found


def assert_same_training(single: dict, double: dict) -> None:
    """Same parameters (to float noise) and the same per-epoch train loss and validation metric."""
    compared = 0
    for name, value in single["model"].items():
        if name.endswith(SHIFT_INVARIANT):
            continue
        torch.testing.assert_close(double["model"][name], value, rtol=0, atol=1e-5, msg=name)
        compared += 1
    assert compared > 60
    for a, b in zip(single["progress"]["history"], double["progress"]["history"], strict=True):
        assert a["val_rmse"] == pytest.approx(b["val_rmse"], abs=1e-6)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a.keys() == b.keys()
        if "train_objective" in a:  # logged with the MTL loss only
            assert a["train_objective"] == pytest.approx(b["train_objective"], rel=1e-5)
