"""Optimiser groups and NoamLR vs upstream's formula, computed here independently.

Upstream behaviour: docs/upstream-compatibility.md#training-schedule."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.nn.finetune import KermtFinetuneModel
from kermt.train.optim import NoamLR, NoamSchedule, build_optimizer


def _model() -> KermtFinetuneModel:
    config = FinetuneModelConfig(
        encoder=EncoderConfig(hidden_size=8, depth=3, num_attn_head=2),
        readout=ReadoutConfig(),
        head=HeadConfig(num_tasks=2, dataset_type="regression"),
        use_mtl_loss=True,
    )
    return KermtFinetuneModel(config)


def _upstream_lrs(n_steps, warmup_epochs, epochs, steps_per_epoch, init_lr, max_lr, final_lr):
    """Upstream's numpy formula for steps 1..n_steps."""
    warmup = int((np.array([warmup_epochs]) * steps_per_epoch).astype(int)[0])
    total = epochs * steps_per_epoch
    inc = (max_lr - init_lr) / warmup
    gamma = (final_lr / max_lr) ** (1 / (total - warmup))
    lrs = []
    for s in range(1, n_steps + 1):
        if s <= warmup:
            lrs.append(init_lr + s * inc)
        elif s <= total:
            lrs.append(max_lr * gamma ** (s - warmup))
        else:
            lrs.append(final_lr)
    return lrs


def test_param_groups_and_freeze():
    model = _model()
    opt = build_optimizer(model, init_lr=1e-4, weight_decay=1e-7, fine_tune_coff=0.5)
    encoder_ids = {id(p) for n, p in model.named_parameters() if n.startswith("kermt.")}
    assert {id(p) for p in opt.param_groups[0]["params"]} == encoder_ids
    assert any(p is model.mtl_log_sigma for p in opt.param_groups[1]["params"])
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-5) and opt.param_groups[1]["lr"] == 1e-4
    frozen = _model()
    build_optimizer(frozen, init_lr=1e-4, weight_decay=0.0, fine_tune_coff=1e-7)
    assert not any(p.requires_grad for n, p in frozen.named_parameters() if n.startswith("kermt."))
    assert frozen.mtl_log_sigma.requires_grad


@pytest.mark.parametrize("coff", [1.0, 0.1, 0.0])
def test_noam_lr_sequence_matches_upstream(coff):
    model = _model()
    opt = build_optimizer(model, init_lr=1e-4, weight_decay=0.0, fine_tune_coff=coff)
    schedule = NoamSchedule(warmup_epochs=2.0, epochs=5, steps_per_epoch=3, init_lr=1e-4, max_lr=1e-3, final_lr=1e-5)
    scheduler = NoamLR(opt, schedule, fine_tune_coff=coff)
    expected = _upstream_lrs(20, 2.0, 5, 3, 1e-4, 1e-3, 1e-5)
    seen_head, seen_encoder = [], []
    for _ in range(20):  # the k-th optimizer step runs at lr(k)
        seen_head.append(opt.param_groups[1]["lr"])
        seen_encoder.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    np.testing.assert_allclose(seen_head, expected, rtol=1e-12)
    factor = 1.0 if coff == 0 else coff
    np.testing.assert_allclose(seen_encoder, np.array(expected) * factor, rtol=1e-12)


def test_state_dict_is_json_and_resumes():
    opt = build_optimizer(_model(), init_lr=1e-4, weight_decay=0.0, fine_tune_coff=1.0)
    schedule = NoamSchedule(warmup_epochs=1.0, epochs=3, steps_per_epoch=4, init_lr=1e-4, max_lr=1e-3, final_lr=1e-4)
    scheduler = NoamLR(opt, schedule)
    for _ in range(6):
        scheduler.step()
    saved = json.loads(json.dumps(scheduler.state_dict()))
    opt2 = build_optimizer(_model(), init_lr=1e-4, weight_decay=0.0, fine_tune_coff=1.0)
    resumed = NoamLR(opt2, schedule)
    resumed.load_state_dict(saved)
    assert resumed.current_step == 7
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]


def test_zero_steps_per_epoch_gives_final_lr():
    opt = build_optimizer(_model(), init_lr=1e-4, weight_decay=0.0, fine_tune_coff=1.0)
    NoamLR(opt, NoamSchedule(1.0, 3, 0, 1e-4, 1e-3, 2e-5))
    assert opt.param_groups[1]["lr"] == 2e-5


def test_cpu_step_is_torchs_default_adam_bit_for_bit():
    """Fused Adam is for CUDA only: on CPU the step stays torch's default implementation, whose numbers the
    optimizer oracle checks (tests/kermt/train/test_optim_parity.py); the GPU lane compares fused with it on CUDA."""
    torch.manual_seed(0)
    ours, reference = _model(), _model()
    reference.load_state_dict(ours.state_dict())
    opt = build_optimizer(ours, init_lr=1e-3, weight_decay=1e-4, fine_tune_coff=0.5)
    assert not opt.defaults["fused"] and opt.defaults["foreach"] is None
    encoder = [p for n, p in reference.named_parameters() if n.startswith("kermt.")]
    heads = [p for n, p in reference.named_parameters() if not n.startswith("kermt.")]
    plain = torch.optim.Adam([{"params": encoder, "lr": 5e-4}, {"params": heads, "lr": 1e-3}], lr=1e-3,
                             weight_decay=1e-4)
    for step in range(3):
        for model, optimizer in ((ours, opt), (reference, plain)):
            generator = torch.Generator().manual_seed(step)
            for param in model.parameters():
                param.grad = torch.randn(param.shape, generator=generator)
            optimizer.step()
    for (name, mine), theirs in zip(ours.named_parameters(), reference.parameters()):
        assert torch.equal(mine, theirs), name
