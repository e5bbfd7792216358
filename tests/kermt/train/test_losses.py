"""Training and eval losses: hand computations and the distributed identity (split batch == whole batch)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.kermt.loss_oracles import finetune_loss
from kermt.train.losses import LabelledTargets, eval_task_loss

NAN = float("nan")
TARGETS = torch.tensor([[1.0, 0.0], [0.0, NAN], [1.0, 1.0], [NAN, 0.0]])


def _views(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    atom = torch.randn(4, 2, generator=gen, requires_grad=True)
    bond = torch.randn(4, 2, generator=gen, requires_grad=True)
    return atom, bond


def test_pooled_regression_loss_by_hand():
    atom = torch.tensor([[0.5, 1.0], [2.0, 0.0], [1.0, 1.5], [0.0, -1.0]])
    bond = torch.tensor([[1.5, 0.0], [0.0, 3.0], [1.0, 0.5], [9.0, 1.0]])
    targets = LabelledTargets.from_nan(TARGETS)
    loss = finetune_loss(atom, bond, targets, "regression", 0.1, label_count=targets.mask.sum())
    labelled = [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (3, 1)]
    total = 0.0
    for i, j in labelled:
        a, b, y = atom[i, j].item(), bond[i, j].item(), TARGETS[i, j].item()
        total += (a - y) ** 2 + (b - y) ** 2 + 0.1 * (a - b) ** 2
    assert loss.item() == pytest.approx(total / 6, rel=1e-6)


def test_classification_uses_logits():
    atom = torch.tensor([[2.0]])
    bond = torch.tensor([[-1.0]])
    targets = LabelledTargets.from_nan(torch.tensor([[1.0]]))
    loss = finetune_loss(atom, bond, targets, "classification", 0.0, label_count=torch.tensor(1.0))
    expected = -math.log(1 / (1 + math.exp(-2.0))) - math.log(1 / (1 + math.exp(1.0)))
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def _whole_and_split(log_sigma: torch.Tensor | None, dataset_type: str):
    """Loss and gradients of the whole batch vs two 'ranks' averaged as DDP averages gradients."""
    targets = TARGETS if dataset_type == "classification" else TARGETS * 2.5
    whole_t = LabelledTargets.from_nan(targets)
    count = whole_t.task_counts() if log_sigma is not None else whole_t.mask.sum()
    atom, bond = _views()
    whole = finetune_loss(atom, bond, whole_t, dataset_type, 0.1, count, log_sigma=log_sigma)
    grads_whole = torch.autograd.grad(whole, [atom, bond] + ([log_sigma] if log_sigma is not None else []))
    rank_losses = []
    for rows in (slice(0, 1), slice(1, 4)):
        part = LabelledTargets.from_nan(targets[rows])
        rank_losses.append(
            finetune_loss(atom[rows], bond[rows], part, dataset_type, 0.1, count, world_size=2, log_sigma=log_sigma)
        )
    averaged = sum(rank_losses) / 2
    grads_split = torch.autograd.grad(averaged, [atom, bond] + ([log_sigma] if log_sigma is not None else []))
    return whole, averaged, grads_whole, grads_split


@pytest.mark.parametrize("dataset_type", ["regression", "classification"])
@pytest.mark.parametrize("mtl", [False, True])
def test_split_batch_with_global_count_equals_whole_batch(dataset_type, mtl):
    log_sigma = torch.tensor([0.3, -0.2], requires_grad=True) if mtl else None
    whole, averaged, grads_whole, grads_split = _whole_and_split(log_sigma, dataset_type)
    torch.testing.assert_close(averaged, whole, rtol=1e-5, atol=1e-6)
    for g_whole, g_split in zip(grads_whole, grads_split):
        torch.testing.assert_close(g_split, g_whole, rtol=1e-5, atol=1e-6)


def test_mtl_weighting_by_hand():
    atom = torch.tensor([[1.0, 2.0]])
    bond = torch.tensor([[1.0, 2.0]])
    targets = LabelledTargets.from_nan(torch.tensor([[0.0, 0.0]]))
    s = torch.tensor([0.5, -1.0])
    loss = finetune_loss(atom, bond, targets, "regression", 0.1, targets.task_counts(), log_sigma=s)
    expected = 0.5 * math.exp(-1.0) * 2.0 + 0.5 + 0.5 * math.exp(2.0) * 8.0 - 1.0
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_eval_loss_per_task():
    targets = LabelledTargets.from_nan(TARGETS)
    probs = torch.tensor([[0.9, 0.2], [0.0, 0.5], [0.6, 1.0], [0.3, 0.1]])
    loss = eval_task_loss(probs, targets, "classification")
    task0 = -(math.log(0.9) + math.log(1 - 1e-7) + math.log(0.6)) / 3
    task1 = -(math.log(0.8) + math.log(1 - 1e-7) + math.log(0.9)) / 3
    torch.testing.assert_close(loss, torch.tensor([task0, task1]), rtol=1e-5, atol=1e-6)
    reg = eval_task_loss(torch.zeros(4, 2), targets, "regression")
    torch.testing.assert_close(reg, torch.tensor([2 / 3, 1 / 3]))
