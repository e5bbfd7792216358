"""Optimiser and learning-rate schedule for finetuning (docs/upstream-compatibility.md#training-schedule).

Adam with two parameter groups: group 0 = encoder (``kermt.*``) at ``lr × fine_tune_coff``, group 1 = everything
else (readout, FFN heads, the model's ``mtl_log_sigma``). ``|fine_tune_coff| <= 1e-6`` freezes the encoder.
With every parameter on a CUDA device the step is torch's fused Adam (a few kernels for all tensors instead of a
chain of small ones per tensor); elsewhere it is torch's default implementation, whose CPU numbers the optimizer
oracle checks bit for bit (tests/kermt/train/test_optim_parity.py).

NoamLR: linear warm-up from ``init_lr`` to ``max_lr`` over ``int(warmup_epochs · S)`` steps, then exponential
decay to ``final_lr`` at ``epochs · S`` steps, ``final_lr`` afterwards. S = optimizer steps per epoch counted on
the GLOBAL batch (``train_size // (batch_size · world_size)``, as upstream), passed in by the caller. Like
upstream (a torch LRScheduler whose constructor takes one step), the k-th optimizer step (k = 1, 2, ...) runs
at lr(k).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from torch import nn

FREEZE_TOLERANCE = 1e-6


def encoder_is_frozen(fine_tune_coff: float) -> bool:
    return math.isclose(fine_tune_coff, 0.0, abs_tol=FREEZE_TOLERANCE)


def build_optimizer(model: nn.Module, init_lr: float, weight_decay: float, fine_tune_coff: float) -> torch.optim.Adam:
    """Adam (coupled L2 ``weight_decay``) over [encoder group, head group]; freezes the encoder if coff ~ 0."""
    encoder, heads = [], []
    for name, param in model.named_parameters():
        (encoder if name.startswith("kermt.") else heads).append(param)
    if encoder_is_frozen(fine_tune_coff):
        for param in encoder:
            param.requires_grad_(False)
    groups = [{"params": encoder, "lr": init_lr * fine_tune_coff}, {"params": heads, "lr": init_lr}]
    return torch.optim.Adam(groups, lr=init_lr, weight_decay=weight_decay, **adam_implementation(encoder + heads))


def adam_implementation(params: list[nn.Parameter]) -> dict[str, bool]:
    """``fused=True`` when every parameter lives on CUDA, else torch's default (so CPU numbers stay as they were).

    Call after the model is on its device: the choice follows where the parameters are, never decides it.
    """
    on_cuda = bool(params) and all(param.device.type == "cuda" for param in params)
    return {"fused": True} if on_cuda else {}


@dataclass(frozen=True)
class NoamSchedule:
    """The schedule's numbers; ``lr(step)`` is upstream's formula for one group (before the group factor)."""

    warmup_epochs: float
    epochs: int
    steps_per_epoch: int
    init_lr: float
    max_lr: float
    final_lr: float

    @property
    def warmup_steps(self) -> int:
        return int(self.warmup_epochs * self.steps_per_epoch)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def lr(self, step: int) -> float:
        warmup, total = self.warmup_steps, self.total_steps
        if step <= warmup:  # the per-step increment first, then times step: upstream's rounding, to the last bit
            return self.init_lr + step * ((self.max_lr - self.init_lr) / max(warmup, 1))
        if step <= total:
            gamma = (self.final_lr / self.max_lr) ** (1.0 / (total - warmup))
            return self.max_lr * gamma ** (step - warmup)
        return self.final_lr


class NoamLR(torch.optim.lr_scheduler.LRScheduler):
    """Upstream's NoamLR. Group ``fine_tune_param_idx`` (the encoder) is scaled by ``fine_tune_coff`` — by 1.0
    when it is exactly 0, as upstream (that group is frozen then). ``state_dict`` is JSON-ready."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        schedule: NoamSchedule,
        fine_tune_coff: float = 1.0,
        fine_tune_param_idx: int = 0,
    ) -> None:
        self.schedule = schedule
        self.factors = [1.0] * len(optimizer.param_groups)
        self.factors[fine_tune_param_idx] = 1.0 if fine_tune_coff == 0 else fine_tune_coff
        self.current_step = 0
        super().__init__(optimizer)  # takes the first step: current_step = 1

    def get_lr(self) -> list[float]:
        base = self.schedule.lr(self.current_step)
        return [base * factor for factor in self.factors]

    def step(self, current_step: int | None = None) -> None:  # type: ignore[override]  # upstream NoamLR's signature
        """Advance one step (or jump to ``current_step``) and set every group's lr."""
        self.current_step = self.current_step + 1 if current_step is None else current_step
        self._step_count = getattr(self, "_step_count", 0) + 1
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = lrs

    def state_dict(self) -> dict[str, Any]:
        return {"current_step": self.current_step, "factors": list(self.factors), "schedule": asdict(self.schedule)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if NoamSchedule(**state_dict["schedule"]) != self.schedule:
            raise ValueError(f"saved schedule {state_dict['schedule']} differs from this one {asdict(self.schedule)}")
        self.factors = list(state_dict["factors"])
        self.step(int(state_dict["current_step"]))


class SchedulePlan(Protocol):
    """The schedule settings a plan carries, by their flag names (``DataParallelSettings``)."""

    epochs: int
    warmup_epochs: float
    init_lr: float
    max_lr: float
    final_lr: float
    weight_decay: float


def optimizer_and_scheduler(model: nn.Module, plan: SchedulePlan, steps_per_epoch: int,
                            fine_tune_coff: float = 1.0) -> tuple[torch.optim.Optimizer, NoamLR]:
    """Adam and upstream's Noam schedule over ``steps_per_epoch`` global steps an epoch. Built once the model is on
    its device, so restored Adam state lands next to its parameters."""
    optimizer = build_optimizer(model, plan.init_lr, plan.weight_decay, fine_tune_coff)
    schedule = NoamSchedule(plan.warmup_epochs, plan.epochs, steps_per_epoch, plan.init_lr, plan.max_lr,
                            plan.final_lr)
    return optimizer, NoamLR(optimizer, schedule, fine_tune_coff)
