"""A variance head learns heteroscedastic noise: a tiny model trained with the Gaussian NLL (``--loss mve``) on
synthetic labels whose noise grows with a molecule's fraction of N and O atoms predicts larger stds where the noise
is larger (Spearman > 0.3 on the 200 held-out molecules; measured 0.437 after these 2 epochs, 0.58 after 5)."""

from __future__ import annotations

import numpy as np
import torch
from rdkit import Chem
from scipy.stats import spearmanr

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from kermt.data.scalers import StandardScaler
from kermt.data.tables import load_molecule_table
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.heads import initialize_weights
from kermt.train.step import FinetuneStepSettings, predict_with_variance, train_step
from tests.conftest import DATA_DIR

N_TRAIN, N_ROWS, BATCH = 800, 1000, 32


def _true_noise(smiles: str) -> float:
    """The label noise std of a molecule: 0.1 plus twice its fraction of N and O heavy atoms."""
    atoms = [atom.GetSymbol() for atom in Chem.MolFromSmiles(smiles).GetAtoms()]
    return 0.1 + 2.0 * sum(symbol in ("N", "O") for symbol in atoms) / len(atoms)


def _molecules(smiles: list[str], labels: np.ndarray, scaler: StandardScaler) -> MoleculeSet:
    done = featurize_smiles(smiles)
    return MoleculeSet(done.graphs, None, scaler.transform(labels).astype(np.float32), done.smiles)


def test_a_variance_head_learns_heteroscedastic_noise():
    smiles = list(load_molecule_table(DATA_DIR.parents[1] / "data/sample/admet_demo.csv", max_rows=N_ROWS).smiles)
    noise = np.array([_true_noise(s) for s in smiles])
    labels = (noise * np.random.default_rng(0).standard_normal(len(smiles)))[:, None]  # mean 0: only noise to learn
    scaler = StandardScaler.fit(labels[:N_TRAIN])
    train = _molecules(smiles[:N_TRAIN], labels[:N_TRAIN], scaler)
    held_out = _molecules(smiles[N_TRAIN:], labels[N_TRAIN:], scaler)
    encoder = EncoderConfig(hidden_size=16, depth=2, num_attn_head=1, num_mt_block=1, embedding_output_type="atom")
    head = HeadConfig(num_tasks=1, dataset_type="regression", ffn_hidden_size=16, variance=True)
    torch.manual_seed(0)
    model = KermtFinetuneModel(FinetuneModelConfig(encoder, ReadoutConfig(), head))
    for name, module in model.named_children():
        if name != "kermt":  # the heads as a finetune initialises them; the encoder keeps its own init
            initialize_weights(module)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    settings, operators = FinetuneStepSettings("regression", dist_coff=0.1), model.kermt.aggregation_spec(True)
    model.train()
    for epoch in range(2):
        order = np.random.default_rng(epoch).permutation(N_TRAIN)
        for start in range(0, N_TRAIN, BATCH):
            train_step(model, optimizer, constant, train.batch(order[start : start + BATCH], operators=operators),
                       settings)
    mean, variance = predict_with_variance(model, held_out, np.arange(len(held_out)), 50)
    std = np.sqrt(scaler.inverse_transform_variance(variance))[:, 0]  # de-standardised: times the label std
    assert mean.shape == variance.shape == (N_ROWS - N_TRAIN, 1) and (variance > 0).all()
    np.testing.assert_allclose(std, np.sqrt(variance[:, 0]) * scaler.stds[0])
    assert spearmanr(std, noise[N_TRAIN:]).statistic > 0.3
