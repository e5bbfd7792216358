"""Total pretraining loss of each mode (docs/upstream-compatibility.md#pretraining), with upstream's logged components.

    vocab:  vocab_total
    cmim:   cmim_total = mean(cmim) + reconstruction_loss_weight · mean(recon)
    hybrid: cmim_total + vocab_loss_weight · vocab_total

Every term is a mean over the local batch, as upstream computes it per DDP rank (the contrastive term also draws its
negatives from the local batch only).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from kermt.losses import connected_zero
from kermt.nn.decoder import reconstruction_terms
from kermt.nn.pretrain_cmim import cmim_terms
from kermt.nn.pretrain_config import PretrainHeadsConfig, PretrainLossConfig
from kermt.nn.pretrain_model import PretrainBatch, PretrainOutput
from kermt.nn.pretrain_vocab import VocabLoss, vocab_loss


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


__all__ = ["CmimLoss", "PretrainLoss", "cmim_loss", "pretrain_loss"]
