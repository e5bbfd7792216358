"""Loss oracles for tests: upstream's losses computed the way upstream computes them, one local batch at a time.

The library trains with global-batch shares (kermt.pretrain.loss, kermt.train.losses.two_view_terms +
reduce_terms); these local-mean forms are what upstream's fixtures were recorded with, so the parity tests compare
the library against them. Total pretraining loss of each mode (docs/upstream-compatibility.md#pretraining):

    vocab:  vocab_total
    cmim:   cmim_total = mean(cmim) + reconstruction_loss_weight · mean(recon)
    hybrid: cmim_total + vocab_loss_weight · vocab_total

Every term is a mean over the local batch, as upstream computes it per DDP rank (the contrastive term also draws its
negatives from the local batch only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch.nn import functional as F

from kermt.config import DatasetType
from kermt.nn.pretrain.cmim import LatentParams, gaussian_log_densities, without_own_column
from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig
from kermt.nn.pretrain.decoder import reconstruction_terms
from kermt.nn.pretrain.model import PretrainBatch, PretrainOutput
from kermt.nn.pretrain.vocab_heads import VocabPredictions, VocabTargets
from kermt.train.losses import LabelledTargets, reduce_terms, two_view_terms


def connected_zero(*tensors: torch.Tensor | None) -> torch.Tensor:
    """A 0 computed from ``tensors``: the loss of a worker's EMPTY share of a global batch.

    A mean over no molecules is NaN, and NaN gradients, once all-reduced, would poison every rank. This is 0 instead,
    and still a function of every output, so the backward gives each parameter that produced them a zero gradient
    (DDP without ``find_unused_parameters`` needs one on every rank). The tensors must be finite (outputs are).
    """
    present = [t.sum() for t in tensors if t is not None]
    if not present:
        raise ValueError("connected_zero needs at least one tensor")
    return torch.stack(present).sum() * 0.0


@dataclass(frozen=True)
class VocabLoss:
    """Upstream's seven logged values: total = av + bv + fg + dist_coff·(av_dist + bv_dist) + fg_dist."""

    total: torch.Tensor
    av: torch.Tensor
    bv: torch.Tensor
    fg: torch.Tensor
    av_dist: torch.Tensor
    bv_dist: torch.Tensor
    fg_dist: torch.Tensor

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        """Values in upstream's order (overall, av, bv, fg, av_dist, bv_dist, fg_dist)."""
        return tuple(getattr(self, f.name) for f in fields(self))


def _labelled_nll(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean NLL over labelled rows (label 0 ignored), as a sum over a clamped count: no host sync, and 0 rather than
    upstream's NaN when nothing is labelled (e.g. a batch of bond-free molecules) — our only departure from it."""
    total = F.nll_loss(log_probs, labels, ignore_index=0, reduction="sum")
    return total / (labels != 0).sum().clamp(min=1).to(total.dtype)


def _pair_terms(
    first: torch.Tensor | None,
    second: torch.Tensor | None,
    fg_first: torch.Tensor | None,
    fg_second: torch.Tensor | None,
    labels: torch.Tensor,
    fg_labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(vocab NLL, fg BCE, vocab disagreement, fg disagreement) of one pair of families (atom_* or bond_*)."""
    zero = fg_labels.new_zeros(())
    nll, bce, dist, fg_dist = zero, zero, zero, zero
    for log_probs, fg_logits in ((first, fg_first), (second, fg_second)):
        if log_probs is not None:
            nll = nll + _labelled_nll(log_probs, labels)
            bce = bce + F.binary_cross_entropy_with_logits(fg_logits, fg_labels)
    if first is not None and second is not None:
        dist = F.mse_loss(first, second)  # over ALL rows, on log-probabilities
        fg_dist = F.mse_loss(torch.sigmoid(fg_first), torch.sigmoid(fg_second))
    return nll, bce, dist, fg_dist


def vocab_loss(preds: VocabPredictions, targets: VocabTargets, dist_coff: float = 0.1) -> VocabLoss:
    """Upstream's ``VocabPredictionModule.compute_loss``; ``fg_dist`` is deliberately not scaled (as upstream, see
    docs/upstream-compatibility.md#pretraining).

    A batch without molecules (a worker's empty share) has every term 0: otherwise the fg means would be NaN and the
    disagreement terms would score the padding row alone.
    """
    fg_labels = targets.fg.to(_preds_dtype(preds))
    if fg_labels.shape[0] == 0:
        zero = connected_zero(*(getattr(preds, f.name) for f in fields(preds)))
        return VocabLoss(total=zero, av=zero, bv=zero, fg=zero, av_dist=zero, bv_dist=zero, fg_dist=zero)
    av, fg_atom, av_dist, fg_atom_dist = _pair_terms(
        preds.atom_from_atom, preds.atom_from_bond, preds.fg_atom_from_atom, preds.fg_atom_from_bond,
        targets.atom, fg_labels,
    )
    bv, fg_bond, bv_dist, fg_bond_dist = _pair_terms(
        preds.bond_from_atom, preds.bond_from_bond, preds.fg_bond_from_atom, preds.fg_bond_from_bond,
        targets.bond, fg_labels,
    )
    fg, fg_dist = fg_atom + fg_bond, fg_atom_dist + fg_bond_dist
    total = av + bv + fg + dist_coff * av_dist + dist_coff * bv_dist + fg_dist
    return VocabLoss(total=total, av=av, bv=bv, fg=fg, av_dist=av_dist, bv_dist=bv_dist, fg_dist=fg_dist)


def _preds_dtype(preds: VocabPredictions) -> torch.dtype:
    """Floating dtype of the predictions (float32 unless the model runs in another precision)."""
    for f in fields(preds):
        value = getattr(preds, f.name)
        if value is not None:
            return value.dtype
    raise ValueError("VocabPredictions holds no tensors: the encoder produced no embedding family")




@dataclass(frozen=True)
class CmimTerms:
    """Per-molecule [M] values: ``cmim`` loss, contrastive ``log_p_k1_given_zx``, ``log_q_z_given_x``, ``log_P_z``."""

    cmim: torch.Tensor
    log_p_k1_given_zx: torch.Tensor
    log_q_z_given_x: torch.Tensor
    log_P_z: torch.Tensor


def contrastive_log_prob(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(k=1 | z, x) per molecule [M]: own cosine similarity (1/T) against the mean of the others'.

    ``pos - logsumexp([pos, neg_j - log(M-1) for j != i])``; 0 for a batch of one molecule.
    """
    count = z.shape[0]
    if count < 2:
        return z.new_zeros(count)
    unit = F.normalize(z.flatten(1), dim=1)
    positive = (unit * unit).sum(dim=1) / temperature  # 1/T up to rounding, kept as computed for parity
    similarity = unit @ unit.T / temperature
    negatives = without_own_column(similarity, torch.arange(count, device=z.device)) - math.log(count - 1)
    return positive - torch.logsumexp(torch.cat([positive.unsqueeze(1), negatives], dim=1), dim=1)


def cmim_terms(
    params: LatentParams,
    z: torch.Tensor,
    temperature: float,
    normalize_loss: bool = False,
    normalize_gradient: bool = False,
) -> CmimTerms:
    """Contrastive and Gaussian terms of cMIM for latents ``z`` [M, latent] drawn from ``params`` (the batch's own
    molecules as negatives).

    ``normalize_loss`` scales both log-densities by 1/latent_dim; ``normalize_gradient`` scales only their gradient.
    """
    log_p = contrastive_log_prob(z, temperature)
    log_q, log_prior = gaussian_log_densities(params, z, normalize_loss, normalize_gradient)
    return CmimTerms(
        cmim=-(log_p + 0.5 * (log_q + log_prior)), log_p_k1_given_zx=log_p, log_q_z_given_x=log_q, log_P_z=log_prior
    )




def finetune_loss(
    atom_view: torch.Tensor,
    bond_view: torch.Tensor,
    targets: LabelledTargets,
    dataset_type: DatasetType,
    dist_coff: float,
    label_count: torch.Tensor,
    world_size: int = 1,
    log_sigma: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scalar training loss of this rank's batch.

    label_count: the global number of labels: a scalar for the pooled loss, or a per-task [T] tensor with
        ``log_sigma`` (MTL: ``Σ_t 0.5·exp(−2 s_t)·L_t + s_t`` with ``L_t`` the task's pooled loss).
    world_size: number of data-parallel ranks whose gradients are averaged (1 without DDP).
    """
    terms = two_view_terms(atom_view, bond_view, targets, dataset_type, dist_coff)
    return reduce_terms(terms, label_count, world_size, log_sigma)


@dataclass(frozen=True)
class CmimLoss:
    """Batch means: ``total`` = ``cmim_loss`` + weight · ``recon_loss``; the rest are logged components.
    ``recon_accuracy`` is the token accuracy over non-pad targets (no gradient)."""

    total: torch.Tensor
    recon_loss: torch.Tensor
    cmim_loss: torch.Tensor
    log_p_k1_given_zx: torch.Tensor
    log_q_z_given_x: torch.Tensor
    log_P_z: torch.Tensor
    recon_accuracy: torch.Tensor


@dataclass(frozen=True)
class PretrainLoss:
    """``total`` to backpropagate, plus the components of whichever objectives the mode has."""

    total: torch.Tensor
    vocab: VocabLoss | None = None
    cmim: CmimLoss | None = None

    def scalars(self) -> dict[str, float]:
        """Detached values under upstream's TensorBoard names (``loss``, ``av_loss``, ..., ``cmim_total``)."""
        values = {"loss": float(self.total.detach())}
        if self.vocab is not None:
            values.update({f"{f.name}_loss": float(getattr(self.vocab, f.name).detach()) for f in fields(self.vocab)})
            values["vocab_loss"] = values.pop("total_loss")
        if self.cmim is not None:
            values.update({f.name: float(getattr(self.cmim, f.name).detach()) for f in fields(self.cmim)})
            values["cmim_total"] = values.pop("total")
        return values


def cmim_loss(output: PretrainOutput, temperature: float, config: PretrainLossConfig) -> CmimLoss:
    """cMIM terms at the latent ``output.z`` the decoder was conditioned on, plus teacher-forced reconstruction."""
    if output.latent is None or output.z is None or output.decoder_logits is None or output.teacher is None:
        raise ValueError("cmim_loss needs the latent head and decoder outputs (pretrain_mode cmim or hybrid)")
    if output.z.shape[0] == 0:  # a worker's empty share: 0, not the NaN of a mean over no molecules
        zero = connected_zero(output.latent.mean, output.latent.log_scale, output.decoder_logits)
        return CmimLoss(zero, zero, zero, zero, zero, zero, zero.detach())
    terms = cmim_terms(output.latent, output.z, temperature, config.normalize_loss, config.normalize_gradient)
    teacher = output.teacher
    recon = reconstruction_terms(output.decoder_logits, teacher.targets, teacher.padding_mask)
    recon_loss = recon.loss.mean()
    return CmimLoss(
        total=terms.cmim.mean() + config.reconstruction_loss_weight * recon_loss,
        recon_loss=recon_loss,
        cmim_loss=terms.cmim.mean(),
        log_p_k1_given_zx=terms.log_p_k1_given_zx.mean(),
        log_q_z_given_x=terms.log_q_z_given_x.mean(),
        log_P_z=terms.log_P_z.mean(),
        recon_accuracy=recon.accuracy.mean().detach(),
    )


def pretrain_loss(
    output: PretrainOutput, batch: PretrainBatch, heads: PretrainHeadsConfig, config: PretrainLossConfig
) -> PretrainLoss:
    """The mode's total loss and its components."""
    vocab = None
    if heads.uses_vocab:
        if output.vocab is None or batch.vocab_targets is None:
            raise ValueError(f"pretrain_mode {heads.pretrain_mode!r} needs vocab predictions and batch.vocab_targets")
        vocab = vocab_loss(output.vocab, batch.vocab_targets, config.dist_coff)
    cmim = cmim_loss(output, heads.contrastive_temperature, config) if heads.uses_decoder else None
    if vocab is not None and cmim is not None:
        total = cmim.total + config.vocab_loss_weight * vocab.total
    else:
        total = vocab.total if vocab is not None else cmim.total
    return PretrainLoss(total=total, vocab=vocab, cmim=cmim)
