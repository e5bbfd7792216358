"""Upstream parity on CUDA: the fixture checkpoints' eval outputs and the architecture oracle's train steps (views
and every gradient), computed on the GPU and compared with what upstream's own code recorded.

Tolerances. On CPU parity is 1e-5 (docs/numerics.md#parity-tolerances). cuBLAS and the sparse neighbour sums add
in another order than the CPU kernels, so with TF32 off the GPU gets 1e-4 absolute on outputs and 1e-3 relative on
gradients: ten times the CPU room, still far below any real difference (a wrong padding row or depth draw moves
outputs by 1e-2 or more). With TF32 on (what a user may enable for speed) matmuls keep 10 mantissa bits, so
outputs only stay within 2 % of their largest magnitude; that is measured too, so the lane says what TF32 costs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.conftest import DATA_DIR
from tests.gpu.cuda import GPU_LANE, max_distance, tf32
from tests.kermt.nn.test_arch_parity import _cases, _finetune_model
from tests.kermt.nn.test_finetune_parity import CHECKPOINTS, _loaded_model
from tests.kermt.nn.upstream_fixtures import fixture_batch, outputs

pytestmark = GPU_LANE

CUDA_TOL = 1e-4
CUDA_GRAD_RTOL = 1e-3
TF32_FRACTION = 0.02
ARCH_ORACLE = DATA_DIR / "kermt_upstream_arch" / "arch_outputs.npz"


def _cuda_eval(name: str):
    prefix = CHECKPOINTS[name]
    features = outputs().get(f"{prefix}_features_batch")
    model = _loaded_model(name).to("cuda")
    features = None if features is None else torch.from_numpy(features).cuda()
    with torch.no_grad():
        return prefix, model(fixture_batch().to("cuda"), features)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_eval_outputs_on_cuda_equal_upstreams(name):
    with tf32(False):
        prefix, result = _cuda_eval(name)
    expected = outputs()
    checks = {"atom_view": "pred_atom_view_logits", "bond_view": "pred_bond_view_logits",
              "prediction": "model_output", "readout_atom_view": "mol_readout_atom_from_atom"}
    for ours, theirs in checks.items():
        distance = max_distance(getattr(result, ours), expected[f"{prefix}_{theirs}"])
        print(f"{name} {ours}: max |cuda - upstream| = {distance:.2e}")
        assert distance <= CUDA_TOL, (ours, distance)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_eval_outputs_with_tf32_stay_within_two_percent(name):
    with tf32(True):
        prefix, result = _cuda_eval(name)
    expected = outputs()[f"{prefix}_model_output"]
    distance = max_distance(result.prediction, expected)
    print(f"{name} prediction with TF32: max |cuda - upstream| = {distance:.2e} (max |value| "
          f"{np.abs(expected).max():.2e})")
    assert distance <= TF32_FRACTION * float(np.abs(expected).max())


@pytest.fixture(scope="module")
def arch_oracle() -> dict[str, np.ndarray]:
    with np.load(ARCH_ORACLE) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize("case", _cases())
def test_train_step_on_cuda_equals_upstreams(arch_oracle, case, tmp_path):
    """Dropout 0 (CUDA draws other dropout masks than the CPU generator upstream ran with), dynamic depths from
    numpy's global RNG, so the same depths as upstream's recorded step."""
    model = _finetune_model(arch_oracle, case, tmp_path).to("cuda").train()
    step = json.loads(str(arch_oracle[f"{case}::step"]))
    features = torch.from_numpy(outputs()["ft_reg_features_batch"]).cuda() if model.config.head.features_size else None
    with tf32(False):
        np.random.seed(step["seed"])
        torch.manual_seed(step["seed"])
        out = model(fixture_batch().to("cuda"), features)
        (float(arch_oracle["loss_weight_a"]) * out.atom_view.square().sum() + out.bond_view.square().sum()).backward()
    for view in ("atom_view", "bond_view"):
        distance = max_distance(getattr(out, view), arch_oracle[f"{case}::{view}"])
        assert distance <= CUDA_TOL, (view, distance)
    ours = {name: p.grad.cpu().numpy() for name, p in model.named_parameters() if p.grad is not None}
    sizes = [int(np.prod(shape)) for _, shape in step["grads"]]
    flat = np.split(arch_oracle[f"{case}::grads"], np.cumsum(sizes)[:-1])
    worst = 0.0
    for (name, shape), values in zip(step["grads"], flat):
        expected = values.reshape(shape)
        scale = max(float(np.abs(expected).max()), 1.0)
        np.testing.assert_allclose(ours[name], expected, rtol=CUDA_GRAD_RTOL, atol=CUDA_TOL * scale, err_msg=name)
        worst = max(worst, float(np.abs(ours[name] - expected).max()) / scale)
    print(f"{case}: views and {len(sizes)} gradients within tolerance; worst gradient distance {worst:.2e} x scale")
