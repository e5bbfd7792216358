"""The spreads an Ensemble predicts beyond its members' std: variance heads (``--loss mve``: total std =
sqrt(mean of the members' variances + variance of their means)) and MC dropout (``dropout_samples``: seeded per
molecule, so predicting twice gives the same numbers). Members are built from the upstream regression fixture."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from kermt.checkpoint import load_finetune_model, read_checkpoint, save_native, unbuilt_encoder_tensors
from kermt.errors import UserError
from kermt.inference import Ensemble, plan_features, read_members, scale_features
from kermt.inference.mc_dropout import NO_DROPOUT
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.heads import initialize_weights
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import featurized

SOURCE = FIXTURE_DIR / "ckpt_ft_reg.pt"


def _molecules():
    return featurized(plan_features([read_checkpoint(SOURCE).spec]).generator)


def _member(directory: Path, seed: int, variance: bool = True, dropout: float = 0.0) -> Path:
    """The fixture's encoder and scalers under new heads (a variance head when ``variance``), saved natively."""
    checkpoint = read_checkpoint(SOURCE)
    head = dataclasses.replace(checkpoint.spec.head, variance=variance, dropout=dropout)
    encoder = dataclasses.replace(checkpoint.spec.encoder, dropout=dropout)  # one --dropout sets both, as upstream
    spec = dataclasses.replace(checkpoint.spec, head=head, encoder=encoder)
    torch.manual_seed(seed)
    model = KermtFinetuneModel(spec.finetune_model_config())
    for name, module in model.named_children():
        if name != "kermt":
            initialize_weights(module)
    encoder_state = {k: v for k, v in load_finetune_model(checkpoint)[0].state_dict().items() if k.startswith("kermt.")}
    model.load_state_dict({**model.state_dict(), **encoder_state})
    return save_native(directory, model.state_dict(), spec, passthrough=unbuilt_encoder_tensors(checkpoint))


def _own_variance(path: Path, molecules) -> tuple[np.ndarray, np.ndarray]:
    """One member's mean and variance in target units, straight from its forward."""
    checkpoint = read_checkpoint(path)
    model, _ = load_finetune_model(checkpoint)
    with torch.no_grad():
        features = scale_features(checkpoint.spec, molecules.features)
        out = model.eval()(molecules.batch_graph(model.kermt.aggregation_spec(False)), features)
    scaler = checkpoint.spec.data_scaler
    return scaler.inverse_transform(out.prediction.double().numpy()), \
        scaler.inverse_transform_variance(out.variance.double().numpy())


def test_one_variance_head_predicts_its_own_std_and_two_the_total_std(tmp_path):
    molecules = _molecules()
    paths = [_member(tmp_path / f"m{k}", seed=k) for k in range(2)]
    # one batch at its own width (upstream batching), as the forward below
    alone = Ensemble(read_members(paths[:1]), upstream_batching=True).predict(molecules, batch_size=32)
    mean, variance = _own_variance(paths[0], molecules)
    np.testing.assert_allclose(alone.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(alone.std, np.sqrt(variance), rtol=1e-5)
    pair = Ensemble(read_members(paths), upstream_batching=True).predict(molecules, batch_size=32)
    means, variances = zip(*(_own_variance(p, molecules) for p in paths))
    total = np.sqrt(np.mean(variances, axis=0) + np.var(means, axis=0))
    np.testing.assert_allclose(pair.std, total, rtol=1e-5)
    assert (pair.std > np.std(means, axis=0)).all()  # the aleatoric part on top of the members' spread


def test_mc_dropout_is_deterministic_and_spreads(tmp_path):
    molecules = _molecules()
    path = _member(tmp_path / "m", seed=0, variance=False, dropout=0.2)
    first = Ensemble(read_members([path]), dropout_samples=4).predict(molecules, batch_size=32)
    again = Ensemble(read_members([path]), dropout_samples=4).predict(molecules, batch_size=32)
    np.testing.assert_array_equal(first.mean, again.mean)
    np.testing.assert_array_equal(first.std, again.std)
    assert (first.std > 0).all()
    plain = Ensemble(read_members([path])).predict(molecules, batch_size=32)
    assert (plain.std == 0).all() and not np.array_equal(plain.mean, first.mean)
    # a molecule's passes are keyed by its SMILES, not its row: the same numbers in another order of rows
    reordered = Ensemble(read_members([path]), dropout_samples=4).member_predictions(molecules.select([3, 1, 2]))
    in_order = Ensemble(read_members([path]), dropout_samples=4).member_predictions(molecules.select([1, 2, 3]))
    assert reordered.shape == (4, 3, 2)  # 4 passes, 3 molecules, the fixture's 2 tasks
    np.testing.assert_allclose(reordered[:, [1, 2, 0]], in_order, rtol=1e-5)


def test_mc_dropout_needs_dropout(tmp_path):
    with pytest.raises(UserError, match=NO_DROPOUT):
        Ensemble(read_members([_member(tmp_path / "m", seed=0, variance=False)]), dropout_samples=3)
