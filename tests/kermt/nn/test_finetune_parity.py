"""Finetune model vs upstream: every intermediate of the three finetuned fixture checkpoints (eval mode)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kermt.nn.finetune import KermtFinetuneModel
from tests.kermt.nn.upstream_fixtures import (
    finetune_config_from_args,
    fixture_batch,
    load_upstream_checkpoint,
    outputs,
)

TOL = 1e-5
CHECKPOINTS = {"ckpt_ft_reg.pt": "ft_reg", "ckpt_ft_reg_ts.pt": "ft_reg_ts", "ckpt_ft_cls.pt": "ft_cls"}
BOND_BRANCH_PREFIXES = ("kermt.encoders.ffn_bond_from_", "kermt.encoders.bond_from_")


def _loaded_model(ckpt_name: str) -> KermtFinetuneModel:
    ckpt = load_upstream_checkpoint(ckpt_name)
    model = KermtFinetuneModel(finetune_config_from_args(ckpt["args"]))
    missing, unexpected = model.load_state_dict(ckpt["state_dict"], strict=False)
    assert missing == []
    assert unexpected and all(key.startswith(BOND_BRANCH_PREFIXES) for key in unexpected)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def case(request):
    name = request.param
    prefix = CHECKPOINTS[name]
    expected = outputs()
    features = expected.get(f"{prefix}_features_batch")
    model = _loaded_model(name)
    with torch.no_grad():
        result = model(fixture_batch(), None if features is None else torch.from_numpy(features))
    return name, prefix, result


def _close(actual: torch.Tensor, key: str) -> None:
    expected = outputs()[key]
    assert actual.shape == expected.shape, key
    np.testing.assert_allclose(actual.numpy(), expected, rtol=0, atol=TOL, err_msg=key)


def test_encoder_outputs(case):
    _, prefix, result = case
    _close(result.encoder.atom_from_atom, f"{prefix}_enc_atom_from_atom")
    _close(result.encoder.atom_from_bond, f"{prefix}_enc_atom_from_bond")
    assert result.encoder.bond_from_atom is None and result.encoder.bond_from_bond is None


def test_readouts_and_ffn(case):
    _, prefix, result = case
    _close(result.readout_atom_view, f"{prefix}_mol_readout_atom_from_atom")
    _close(result.readout_bond_view, f"{prefix}_mol_readout_atom_from_bond")
    _close(result.ffn_atom_view, f"{prefix}_ffn_out_atom_view")
    _close(result.ffn_bond_view, f"{prefix}_ffn_out_bond_view")


def test_view_outputs_and_prediction(case):
    _, prefix, result = case
    _close(result.atom_view, f"{prefix}_pred_atom_view_logits")
    _close(result.bond_view, f"{prefix}_pred_bond_view_logits")
    atom, bond = result.view_predictions
    _close(atom, f"{prefix}_pred_atom_view")
    _close(bond, f"{prefix}_pred_bond_view")
    _close(result.prediction, f"{prefix}_model_output")


def test_final_prediction_after_inverse_scaling(case):
    name, prefix, result = case
    scaler = load_upstream_checkpoint(name)["data_scaler"]
    prediction = result.prediction.double().numpy()
    if scaler is not None:
        prediction = prediction * scaler["stds"] + scaler["means"]
    np.testing.assert_allclose(prediction, outputs()[f"{prefix}_final_prediction"], rtol=0, atol=TOL)


def test_train_mode_returns_logits_not_probabilities():
    model = _loaded_model("ckpt_ft_cls.pt").train()
    torch.manual_seed(0)
    result = model(fixture_batch(), None, depth_rng=np.random.default_rng(0))
    assert result.atom_view.shape == (26, 2)
    assert (result.atom_view < 0).any() or (result.atom_view > 1).any()  # logits, not sigmoid outputs
