"""Optimizer and learning-rate schedule against upstream's own build_optimizer, build_lr_scheduler and NoamLR.

The oracle (tests/data/kermt_upstream_pretrain/optim_step.npz, README there) holds, for a tiny finetune model built
and initialised by upstream's ``build_model``: every parameter group's lr after the scheduler's construction and
after each later step (past the end of the schedule), and every parameter after a few Adam steps from fixed
gradients, with the MTL ``log_sigma`` in the head group as upstream's train loop puts it. Cases: encoder
``fine_tune_coff`` 0.3 with a warm-up ending mid-epoch, and a frozen encoder (coff 0) with world size 2.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace

import numpy as np
import pytest
import torch

from kermt.nn.finetune import KermtFinetuneModel
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer
from tests.conftest import FIXTURE_DIR
from tests.kermt.nn.upstream_fixtures import finetune_config_from_args

ORACLE = FIXTURE_DIR.parent / "kermt_upstream_pretrain" / "optim_step.npz"
CASES = ("coff03", "frozen_ws2")
UPSTREAM_NAMES = {"mtl_log_sigma": "mtl_loss.log_sigma"}  # ours -> upstream (MTLLoss is a separate module there)


@pytest.fixture(scope="module")
def oracle() -> dict[str, np.ndarray]:
    with np.load(ORACLE) as data:
        return {key: data[key] for key in data.files}


def upstream_name(name: str) -> str:
    return UPSTREAM_NAMES.get(name, name)


def fixed_gradient(step: int, name: str, shape: torch.Size, scale: float) -> torch.Tensor:
    """The oracle's gradient of parameter ``name`` (upstream's name) at step ``step``, regenerated."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{step}:{name}".encode()))
    return torch.randn(shape, generator=generator) * scale


def upstream_initialised_model(oracle: dict[str, np.ndarray]) -> KermtFinetuneModel:
    config = replace(finetune_config_from_args(json.loads(str(oracle["model_args"]))), use_mtl_loss=True)
    model = KermtFinetuneModel(config)
    state = {name: torch.from_numpy(oracle[f"init::{upstream_name(name)}"]) for name in model.state_dict()}
    model.load_state_dict(state, strict=True)
    return model


def run_schedule(oracle: dict[str, np.ndarray], case: str):
    """Our optimizer and scheduler driven as upstream's train loop drives them: (lrs [steps+1, groups], model)."""
    settings = json.loads(str(oracle[f"{case}::settings"]))
    model = upstream_initialised_model(oracle)
    optimizer = build_optimizer(model, settings["init_lr"], settings["weight_decay"], settings["fine_tune_coff"])
    steps_per_epoch = settings["train_data_size"] // (settings["batch_size"] * settings["world_size"])
    assert steps_per_epoch == int(oracle[f"{case}::steps_per_epoch"])
    schedule = NoamSchedule(settings["warmup_epochs"], settings["epochs"], steps_per_epoch, settings["init_lr"],
                            settings["max_lr"], settings["final_lr"])
    scheduler = NoamLR(optimizer, schedule, fine_tune_coff=settings["fine_tune_coff"])
    lrs = [[group["lr"] for group in optimizer.param_groups]]
    for step in range(1, len(oracle[f"{case}::lr"])):
        if step <= int(oracle["optim_steps"]):
            for name, param in model.named_parameters():
                if param.requires_grad:
                    param.grad = fixed_gradient(step, upstream_name(name), param.shape, float(oracle["grad_scale"]))
            optimizer.step()
        scheduler.step()
        lrs.append([group["lr"] for group in optimizer.param_groups])
    return np.array(lrs, dtype=np.float64), model


@pytest.fixture(scope="module")
def runs(oracle):
    return {case: run_schedule(oracle, case) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_learning_rates_equal_upstreams(oracle, runs, case) -> None:
    lrs, _ = runs[case]
    # the same float64 operations in the same order as upstream's: equal to the last bit
    np.testing.assert_array_equal(lrs, oracle[f"{case}::lr"])


@pytest.mark.parametrize("case", CASES)
def test_parameters_after_adam_steps_equal_upstreams(oracle, runs, case) -> None:
    _, model = runs[case]
    ours = {upstream_name(name): p.detach().numpy() for name, p in model.named_parameters()}
    recorded = {key.removeprefix(f"{case}::after::"): oracle[key] for key in oracle
                if key.startswith(f"{case}::after::")}
    # upstream also builds the encoder's bond-output branches, which a finetune model never uses (no gradient)
    assert set(recorded) - set(ours) == {name for name in recorded if "bond_from_" in name}
    for name, value in ours.items():
        np.testing.assert_allclose(value, recorded[name], rtol=0, atol=1e-7, err_msg=name)


def test_frozen_encoder_does_not_move_and_heads_do(oracle, runs) -> None:
    _, model = runs["frozen_ws2"]
    for name, param in model.named_parameters():
        moved = not np.array_equal(param.detach().numpy(), oracle[f"init::{upstream_name(name)}"])
        assert moved == (not name.startswith("kermt.") and param.requires_grad), name
