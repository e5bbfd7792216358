"""Pretraining loss terms normalised by GLOBAL counts, so N workers with batch b compute one process's batch N·b.

Every term is returned as this rank's SHARE of the global batch's term: a sum over the rank's molecules (atoms,
bonds, tokens) divided by the global count. Summed over ranks, a share is exactly the term one process computes on
the whole global batch with upstream's batch means (tests.kermt.loss_oracles), which a single process reproduces:

    av, bv        Σ NLL over labelled atoms / bonds ÷ global labelled count (both families of the pair summed)
    fg            Σ BCE over [molecule, fg label] ÷ (global molecules · fg_size) (four families summed)
    av_dist, ...  Σ squared log-prob difference over rows ÷ (global rows · vocab size); the batch graph's padding
                  row is one row of the global batch: only rank 0 counts it (its value is identical on every rank)
    fg_dist       Σ squared sigmoid difference ÷ (global molecules · fg_size)
    cmim, recon   Σ over molecules of the per-molecule term ÷ global molecules; the contrastive term compares each
                  molecule with the latents of the GLOBAL batch (gathered with gradient by the caller)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kermt.nn.pretrain.decoder import reconstruction_terms
from kermt.nn.pretrain.cmim import gaussian_log_densities, without_own_column
from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig
from kermt.nn.pretrain.model import PretrainOutput
from kermt.nn.pretrain.vocab_heads import VocabPredictions, VocabTargets

# Layout of the counts vector a rank contributes and the all-reduce sums.
COUNT_NAMES = ("molecules", "atoms", "bonds", "labelled_atoms", "labelled_bonds")
MOLECULES, ATOMS, BONDS, LABELLED_ATOMS, LABELLED_BONDS = range(len(COUNT_NAMES))
VOCAB_TERMS = ("av", "bv", "fg", "av_dist", "bv_dist", "fg_dist", "vocab_total")
CMIM_TERMS = ("cmim", "recon", "log_p_k1_given_zx", "log_q_z_given_x", "log_P_z", "recon_accuracy", "cmim_total")


@dataclass(frozen=True)
class GlobalView:
    """What a rank knows about the global batch: the all-reduced ``counts`` [len(COUNT_NAMES)] (float, on the
    model's device), whether this rank counts the padding row, and the global latents ``all_z`` [M, latent] with
    this rank's rows starting at ``offset`` (cmim / hybrid only)."""

    counts: torch.Tensor
    counts_padding_row: bool
    all_z: torch.Tensor | None = None
    offset: int = 0


def _sq_diff_sum(first: torch.Tensor, second: torch.Tensor, skip_padding_row: bool) -> torch.Tensor:
    start = 1 if skip_padding_row else 0
    return ((first[start:] - second[start:]) ** 2).sum()


def vocab_shares(preds: VocabPredictions, targets: VocabTargets, view: GlobalView, dist_coff: float,
                 fg_size: int) -> dict[str, torch.Tensor]:
    """This rank's shares of upstream's seven vocab terms (the four embedding families must all be present)."""
    counts = view.counts
    fg_labels = targets.fg.to(preds.atom_from_atom.dtype)
    molecules_fg = counts[MOLECULES].clamp(min=1) * fg_size
    skip = not view.counts_padding_row
    shares = {}
    for name, first, second, labels, labelled, rows in (
        ("a", preds.atom_from_atom, preds.atom_from_bond, targets.atom, LABELLED_ATOMS, ATOMS),
        ("b", preds.bond_from_atom, preds.bond_from_bond, targets.bond, LABELLED_BONDS, BONDS),
    ):
        nll = sum(F.nll_loss(p, labels, ignore_index=0, reduction="sum") for p in (first, second))
        shares[f"{name}v"] = nll / counts[labelled].clamp(min=1)
        shares[f"{name}v_dist"] = _sq_diff_sum(first, second, skip) / ((1 + counts[rows]) * first.shape[1])
    fg, fg_dist = 0.0, 0.0
    for first, second in ((preds.fg_atom_from_atom, preds.fg_atom_from_bond),
                          (preds.fg_bond_from_atom, preds.fg_bond_from_bond)):
        fg = fg + sum(F.binary_cross_entropy_with_logits(x, fg_labels, reduction="sum") for x in (first, second))
        fg_dist = fg_dist + ((torch.sigmoid(first) - torch.sigmoid(second)) ** 2).sum()
    shares["fg"], shares["fg_dist"] = fg / molecules_fg, fg_dist / molecules_fg
    shares["vocab_total"] = (shares["av"] + shares["bv"] + shares["fg"] + dist_coff * shares["av_dist"]
                             + dist_coff * shares["bv_dist"] + shares["fg_dist"])
    return shares


def contrastive_log_prob_global(z: torch.Tensor, all_z: torch.Tensor, offset: int, temperature: float) -> torch.Tensor:
    """log p(k=1 | z, x) [m] of this rank's molecules ``z`` [m, latent] against the global batch ``all_z``
    [M, latent] (rows offset..offset+m are ``z`` themselves): kermt.nn.pretrain.cmim.contrastive_log_prob with
    negatives from every rank."""
    count, mine = all_z.shape[0], z.shape[0]
    if count < 2 or mine == 0:
        return z.new_zeros(mine)
    unit, unit_all = F.normalize(z.flatten(1), dim=1), F.normalize(all_z.flatten(1), dim=1)
    positive = (unit * unit).sum(dim=1) / temperature
    similarity = unit @ unit_all.T / temperature  # [m, M]
    own = offset + torch.arange(mine, device=z.device)
    negatives = without_own_column(similarity, own) - math.log(count - 1)
    return positive - torch.logsumexp(torch.cat([positive.unsqueeze(1), negatives], dim=1), dim=1)


def cmim_shares(output: PretrainOutput, view: GlobalView, temperature: float,
                config: PretrainLossConfig) -> dict[str, torch.Tensor]:
    """This rank's shares of the cMIM terms and the reconstruction loss / token accuracy."""
    assert output.latent is not None and output.z is not None and output.teacher is not None
    assert output.decoder_logits is not None and view.all_z is not None
    molecules = view.counts[MOLECULES].clamp(min=1)
    log_p = contrastive_log_prob_global(output.z, view.all_z, view.offset, temperature)
    log_q, log_prior = gaussian_log_densities(output.latent, output.z, config.normalize_loss,
                                              config.normalize_gradient)  # per molecule: no global view needed
    cmim = -(log_p + 0.5 * (log_q + log_prior))
    teacher = output.teacher
    recon = reconstruction_terms(output.decoder_logits, teacher.targets, teacher.padding_mask)
    # 0·Σ all_z: the gather's backward is a collective, so every rank's loss must reach it (an empty share too).
    shares = {
        "cmim": (cmim.sum() + 0.0 * view.all_z.sum()) / molecules,
        "recon": recon.loss.sum() / molecules,
        "log_p_k1_given_zx": log_p.sum() / molecules,
        "log_q_z_given_x": log_q.sum() / molecules,
        "log_P_z": log_prior.sum() / molecules,
        "recon_accuracy": recon.accuracy.detach().sum() / molecules,
    }
    shares["cmim_total"] = shares["cmim"] + config.reconstruction_loss_weight * shares["recon"]
    return shares


def pretrain_shares(output: PretrainOutput, targets: VocabTargets | None, view: GlobalView,
                    heads: PretrainHeadsConfig, config: PretrainLossConfig) -> dict[str, torch.Tensor]:
    """Every logged share of the mode plus ``loss``, this rank's share of the total to minimise."""
    shares: dict[str, torch.Tensor] = {}
    if heads.uses_vocab:
        assert output.vocab is not None and targets is not None
        shares.update(vocab_shares(output.vocab, targets, view, config.dist_coff, heads.fg_size))
    if heads.uses_decoder:
        shares.update(cmim_shares(output, view, heads.contrastive_temperature, config))
    if heads.pretrain_mode == "hybrid":
        shares["loss"] = shares["cmim_total"] + config.vocab_loss_weight * shares["vocab_total"]
    else:
        shares["loss"] = shares["vocab_total" if heads.uses_vocab else "cmim_total"]
    return shares


__all__ = ["CMIM_TERMS", "COUNT_NAMES", "GlobalView", "VOCAB_TERMS", "contrastive_log_prob_global",
           "cmim_shares", "pretrain_shares", "vocab_shares"]
