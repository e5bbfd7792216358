"""Several training steps against upstream's own training loop: dynamic depths, dropout masks and Adam together.

The oracle (tests/data/kermt_upstream_train/trajectory.npz, recorded by record_trajectory.py beside it) holds
``STEPS`` Adam steps of upstream's ``task/train.py`` loop on one process: ckpt_ft_reg.pt (depth 3: in most steps
some encoder draws no iteration, and upstream's Adam then skips its parameters), fixed regression targets with two
labels missing, seeded once. Our ``train_step`` with numpy's global RNG for the depths and torch's for the masks
must take the same steps: the same loss at each step and the same parameters after the last one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kermt.data.dataset import MoleculeBatch
from kermt.train.step import FinetuneStepSettings, train_step
from tests.conftest import FIXTURE_DIR
from tests.kermt.nn.test_train_mode_parity import _model
from tests.kermt.nn.upstream_fixtures import fixture_batch, outputs

ORACLE = FIXTURE_DIR.parent / "kermt_upstream_train" / "trajectory.npz"
LOSS_RTOL = 1e-5
# Adam normalises each gradient element by its running size, so float noise in a near-zero gradient moves a
# weight by up to ~lr: compare parameters to a small fraction of lr (measured: at most 0.013 lr after 6 steps).
# Updating an encoder upstream skips moves its weights, and through them everything else, by ~lr (measured: up to
# 3.6 lr, and every step's loss 1e-3 off).
PARAM_ATOL_IN_LR = 0.05
# The attention's key-projection bias adds the same value to every logit of a query, which the softmax ignores: its
# exact gradient is 0, and Adam turns float noise into steps of ~lr in both implementations (measured: up to 2.5 lr).
NOISE_ONLY = ("attn.linear_layers.1.bias",)


@pytest.fixture(scope="module")
def oracle() -> dict[str, np.ndarray]:
    with np.load(ORACLE) as data:
        return {key: data[key] for key in data.files}


def _trajectory(oracle: dict, case: str) -> tuple[list[float], dict[str, np.ndarray], list[list[str]]]:
    settings = json.loads(str(oracle["settings"]))
    model = _model(settings["cases"][case])
    optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    batch = MoleculeBatch(fixture_batch(), torch.from_numpy(outputs()["ft_reg_features_batch"]),
                          torch.from_numpy(oracle["targets"]), np.arange(len(oracle["targets"])))
    step_settings = FinetuneStepSettings("regression", settings["dist_coff"], dropout_draws="torch")
    np.random.seed(settings["seed"])  # upstream's global draws: depths (numpy), dropout masks (torch)
    torch.manual_seed(settings["seed"])
    losses, skipped = [], []
    for step in range(settings["steps"]):
        result = train_step(model, optimizer, scheduler, batch, step_settings, None, global_step=step)
        losses.append(float(result.objective_share))
        skipped.append(sorted(name for name, p in model.named_parameters() if p.requires_grad and p.grad is None))
    return losses, {name: p.detach().numpy() for name, p in model.named_parameters()}, skipped


@pytest.mark.parametrize("case", ["dropout0", "dropout02"])
def test_adam_steps_equal_upstreams(oracle, case):
    settings = json.loads(str(oracle["settings"]))
    losses, params, skipped = _trajectory(oracle, case)
    for step, loss in enumerate(losses):
        assert loss == pytest.approx(float(oracle[f"{case}::step{step}::loss"]), rel=LOSS_RTOL), step
        # the encoders upstream skipped (bond branches, which our finetune model does not build, aside)
        upstream_skipped = json.loads(str(oracle[f"{case}::step{step}::no_grad"]))
        assert skipped[step] == sorted(n for n in upstream_skipped if n in params), step
    assert any(skipped), "no step drew a depth that skips an encoder: the oracle no longer tests skipping"
    atol = PARAM_ATOL_IN_LR * settings["lr"]
    for name, value in params.items():
        if name.endswith(NOISE_ONLY):
            continue
        np.testing.assert_allclose(value, oracle[f"{case}::final::{name}"], rtol=0, atol=atol, err_msg=name)
