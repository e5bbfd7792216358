"""Finetune losses: two-view training loss with a disagreement term, and the eval loss.

Upstream behaviour: docs/upstream-compatibility.md#finetune-loss.

Training, per (molecule, task) with a label: ``ℓ = L(atom_view, y) + L(bond_view, y) + dist_coff·(atom_view −
bond_view)²`` with L = BCE-with-logits (classification) or squared error (regression).

A variance head (``--loss mve``) replaces each view's L by the Gaussian negative log-likelihood of its own mean and
variance, ``½·(log σ² + (y − μ)²/σ²)`` (without the constant ½·log 2π), on the scaled targets; the disagreement
term stays on the two means. The reduction is the same.

Reduction uses a label count the CALLER passes, so a data-parallel caller passes the GLOBAL count (sum over ranks)
and ``world_size``: each rank's loss is ``world_size · Σ_local ℓ / global_count``, and DDP's gradient average
(÷ world_size) then gives exactly the single-process gradient of ``Σ_all ℓ / global_count``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kermt.config import DatasetType


@dataclass(frozen=True)
class LabelledTargets:
    """Targets [M, T] with missing labels replaced by 0, and the mask [M, T] (1 where a label exists)."""

    values: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def from_nan(cls, targets: torch.Tensor) -> "LabelledTargets":
        """Missing labels given as NaN."""
        present = ~torch.isnan(targets)
        return cls(torch.where(present, targets, torch.zeros_like(targets)), present.to(targets.dtype))

    def task_counts(self) -> torch.Tensor:
        """Labels per task [T] (all-reduce this across ranks for the global count)."""
        return self.mask.sum(dim=0)


def _elementwise(pred: torch.Tensor, target: torch.Tensor, dataset_type: DatasetType) -> torch.Tensor:
    if dataset_type == "classification":
        return F.binary_cross_entropy_with_logits(pred, target, reduction="none")
    return F.mse_loss(pred, target, reduction="none")


def two_view_terms(
    atom_view: torch.Tensor,
    bond_view: torch.Tensor,
    targets: LabelledTargets,
    dataset_type: DatasetType,
    dist_coff: float,
) -> torch.Tensor:
    """Masked per-element training loss [M, T] (0 where there is no label)."""
    loss = _elementwise(atom_view, targets.values, dataset_type) + _elementwise(bond_view, targets.values, dataset_type)
    loss = loss + dist_coff * (atom_view - bond_view) ** 2
    return loss * targets.mask


def gaussian_nll(mean: torch.Tensor, variance: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Elementwise Gaussian negative log-likelihood without its constant: ½·(log σ² + (y − μ)²/σ²)."""
    return 0.5 * (torch.log(variance) + (target - mean) ** 2 / variance)


def mve_two_view_terms(
    atom_view: torch.Tensor,
    bond_view: torch.Tensor,
    atom_variance: torch.Tensor,
    bond_variance: torch.Tensor,
    targets: LabelledTargets,
    dist_coff: float,
) -> torch.Tensor:
    """Masked per-element training loss [M, T] of a variance head (0 where there is no label): each view's Gaussian
    NLL plus ``dist_coff`` times the squared difference of the two means."""
    loss = gaussian_nll(atom_view, atom_variance, targets.values) \
        + gaussian_nll(bond_view, bond_variance, targets.values)
    loss = loss + dist_coff * (atom_view - bond_view) ** 2
    return loss * targets.mask


def reduce_terms(
    terms: torch.Tensor, label_count: torch.Tensor, world_size: int = 1, log_sigma: torch.Tensor | None = None
) -> torch.Tensor:
    """The loss to backpropagate from :func:`two_view_terms` [molecules, tasks]: their sum over the caller's label
    count (scaled by ``world_size``, see above), or with learnable ``log_sigma`` [tasks] the uncertainty-weighted
    sum of the per-task losses (``--use_mtl_loss``)."""
    if log_sigma is None:
        return world_size * terms.sum() / torch.clamp(label_count, min=1.0)
    task_losses = world_size * terms.sum(dim=0) / torch.clamp(label_count, min=1.0)
    return (0.5 * torch.exp(-2.0 * log_sigma) * task_losses + log_sigma).sum()


def eval_task_loss(prediction: torch.Tensor, targets: LabelledTargets, dataset_type: DatasetType) -> torch.Tensor:
    """Validation loss of one batch per task [T]: masked mean over the batch's labels (0 for a task without).

    ``prediction`` is the model's eval output (mean of the views; probabilities for classification, scored with
    plain BCE after clamping to [1e-7, 1 − 1e-7], as upstream). Upstream averages these over batches unweighted.
    """
    if dataset_type == "classification":
        probs = prediction.clamp(min=1e-7, max=1.0 - 1e-7)
        loss = F.binary_cross_entropy(probs, targets.values, reduction="none")
    else:
        loss = F.mse_loss(prediction, targets.values, reduction="none")
    loss = loss * targets.mask
    return loss.sum(dim=0) / torch.clamp(targets.mask.sum(dim=0), min=1.0)
