"""Architecture options against upstream: bias, 2 MT blocks, every activation, mean readout, task-specific layers.

The oracle (tests/data/kermt_upstream_arch/arch_outputs.npz, recorded by record.py beside it) holds, per case,
upstream's saved args and state-dict layout, its eval-mode prediction and one seeded train step (dynamic depths from
numpy's global RNG, dropout 0: both views and every gradient). The weights are regenerated from (case, key, shape)
by weights.py there and checked against upstream's digest. Each test writes them into a file laid out as upstream's
``save_checkpoint`` writes one and reads it with the library's own reader, as a user's checkpoint would be read.
"""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch

from kermt.checkpoint import load_finetune_model, load_pretrain_model, read_checkpoint
from kermt.nn.pretrain.model import PretrainBatch
from tests.conftest import DATA_DIR
from tests.data.kermt_upstream_arch import weights
from tests.kermt.nn.upstream_fixtures import fixture_batch, outputs

ORACLE = DATA_DIR / "kermt_upstream_arch" / "arch_outputs.npz"
TOL = 1e-5
GRAD_RTOL = 1e-4  # as the train-mode parity test: batch sums in another order (docs/numerics.md#parity-tolerances)
# Two MT blocks double the depth the gradients cancel through: upstream's recorded float32 gradients are up to 9.5e-6
# of their tensor's largest element from a float64 evaluation of the same model, ours up to 5.1e-6 (AVX-512 MKL),
# so the two may sit 1.5e-5 apart where an entry is a near-cancelling sum.
GRAD_ATOL = 2e-5


@pytest.fixture(scope="module")
def oracle() -> dict[str, np.ndarray]:
    with np.load(ORACLE) as data:
        return {key: data[key] for key in data.files}


def _cases() -> list[str]:
    with np.load(ORACLE) as data:
        return [str(name) for name in data["cases"]]


def _upstream_file(oracle: dict, case: str, directory: Path, args: dict, **entries) -> Path:
    """The case's model as an upstream ``.pt`` file: saved args (a Namespace, ``args`` over the recorded ones),
    state dict, ``entries``."""
    saved = json.loads(str(oracle[f"{case}::checkpoint"]))
    state = weights.state_dict(case, saved["layout"])
    assert weights.digest(state) == saved["digest"], "regenerated weights differ from those upstream ran with"
    path = directory / f"{case}.pt"
    torch.save({"args": Namespace(**{**saved["args"], **args}), "state_dict": state, **entries}, path)
    return path


def _finetune_model(oracle: dict, case: str, directory: Path, dropout: float = 0.0) -> torch.nn.Module:
    """Read as upstream's save_checkpoint writes a model trained with ``dropout`` (the reader takes it from args)."""
    scaler = json.loads(str(oracle[f"{case}::checkpoint"]))["data_scaler"]
    scaler = {key: np.array(values) for key, values in scaler.items()}
    path = _upstream_file(oracle, case, directory, {"dropout": dropout}, data_scaler=scaler, features_scaler=None)
    model, _ = load_finetune_model(read_checkpoint(path))
    return model


def _seeded_train_forward(model, seed: int):
    np.random.seed(seed)
    torch.manual_seed(seed)
    return model.train()(fixture_batch(), _features(model))  # depth_rng None: numpy's global RNG, as upstream


def _features(model) -> torch.Tensor | None:
    return torch.from_numpy(outputs()["ft_reg_features_batch"]) if model.config.head.features_size else None


@pytest.mark.parametrize("case", _cases())
def test_eval_prediction_equals_upstreams(oracle, case, tmp_path):
    model = _finetune_model(oracle, case, tmp_path).eval()
    with torch.no_grad():
        prediction = model(fixture_batch(), _features(model)).prediction
    np.testing.assert_allclose(prediction.numpy(), oracle[f"{case}::prediction"], rtol=0, atol=TOL)


@pytest.mark.parametrize("case", _cases())
def test_train_step_equals_upstreams(oracle, case, tmp_path):
    model = _finetune_model(oracle, case, tmp_path)
    step = json.loads(str(oracle[f"{case}::step"]))
    out = _seeded_train_forward(model, step["seed"])
    (float(oracle["loss_weight_a"]) * out.atom_view.square().sum() + out.bond_view.square().sum()).backward()

    for view in ("atom_view", "bond_view"):
        np.testing.assert_allclose(getattr(out, view).detach().numpy(), oracle[f"{case}::{view}"], rtol=0, atol=TOL,
                                   err_msg=view)
    ours = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    sizes = [int(np.prod(shape)) for _, shape in step["grads"]]
    flat = np.split(oracle[f"{case}::grads"], np.cumsum(sizes)[:-1])
    expected = {name: values.reshape(shape) for (name, shape), values in zip(step["grads"], flat)}
    # Without dropout our encoders run stacked, and an encoder that drew zero iterations gets a zero gradient where
    # upstream's has none (docs/numerics.md#random-draws)
    assert set(expected) <= set(ours)
    assert all(not ours[name].any() for name in set(ours) - set(expected))
    for name, grad in expected.items():
        scale = max(float(np.abs(grad).max()), 1.0)
        np.testing.assert_allclose(ours[name].numpy(), grad, rtol=GRAD_RTOL, atol=GRAD_ATOL * scale, err_msg=name)


@pytest.mark.parametrize("case", _cases())
def test_train_views_with_dropout_equal_upstreams(oracle, case, tmp_path):
    """Dropout masks drawn in upstream's order (encoder by encoder) with bias, 2 blocks and each activation."""
    step = json.loads(str(oracle[f"{case}::step"]))
    model = _finetune_model(oracle, case, tmp_path, dropout=step["dropout"])
    with torch.no_grad():
        out = _seeded_train_forward(model, step["seed"])
    views = torch.stack([out.atom_view, out.bond_view]).numpy()
    np.testing.assert_allclose(views, oracle[f"{case}::dropout_views"], rtol=0, atol=TOL)


def test_the_oracle_covers_the_options(oracle):
    """Every option the cases are named for is in the saved args, and some encoder drew zero iterations."""
    args = {case: json.loads(str(oracle[f"{case}::checkpoint"]))["args"] for case in _cases()}
    seen = {(key, str(a[key])) for a in args.values() for key in ("bias", "num_mt_block", "activation",
                                                                     "self_attention", "ffn_num_task_specific_layers")}
    expected = {("bias", "True"), ("bias", "False"), ("num_mt_block", "1"), ("num_mt_block", "2"),
                ("self_attention", "True"), ("self_attention", "False"), ("ffn_num_task_specific_layers", "0"),
                ("ffn_num_task_specific_layers", "1"), ("ffn_num_task_specific_layers", "2")}
    expected |= {("activation", name) for name in ("PReLU", "ELU", "ReLU", "LeakyReLU", "SELU", "tanh")}
    assert expected <= seen
    assert any((oracle[f"{case}::depths"] == 0).any() for case in _cases())


def test_vocab_pretrain_heads_equal_upstreams(oracle, tmp_path):
    """Upstream's KermtTask with bias and 2 MT blocks, read from an upstream-layout pretraining file (eval mode)."""
    training = dict(optimizer={}, scheduler_step=0, batch_idx=0, epoch=0, data_scaler=None, features_scaler=None,
                    wandb_run_id=None)
    model, _ = load_pretrain_model(read_checkpoint(_upstream_file(oracle, "vocab", tmp_path, {}, **training)))
    with torch.no_grad():
        preds = model.eval()(PretrainBatch(graph=fixture_batch()), sample_latent=False).vocab
    for ours, key in (
        (preds.atom_from_atom, "av_from_atom"), (preds.atom_from_bond, "av_from_bond"),
        (preds.bond_from_atom, "bv_from_atom"), (preds.bond_from_bond, "bv_from_bond"),
        (preds.fg_atom_from_atom, "fg_atom_from_atom"), (preds.fg_atom_from_bond, "fg_atom_from_bond"),
        (preds.fg_bond_from_atom, "fg_bond_from_atom"), (preds.fg_bond_from_bond, "fg_bond_from_bond"),
    ):
        np.testing.assert_allclose(ours.numpy(), oracle[f"vocab::{key}"], rtol=0, atol=TOL, err_msg=key)
