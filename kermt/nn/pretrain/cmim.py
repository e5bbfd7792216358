"""cMIM latent head and the pieces of its contrastive + Gaussian loss terms
(docs/upstream-compatibility.md#pretraining).

The latent head (upstream ``KERMTLatentDistribution``, keys ``latent_dist.{kermt,readout,fc_mean_logscale}``) pools
each embedding family with a mean readout, averages the families and projects to (mean, log_scale) of a diagonal
Gaussian q(z|x). The loss per molecule is ``-(log p(k=1|z,x) + ½(log q(z|x) + log P(z)))``: a contrastive term
(the molecule's own latent against the average of the others) plus the encoder and prior log-densities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kermt.config import ReadoutConfig
from kermt.data.batch import BatchMolGraph
from kermt.nn.encoder import EncoderOutput, KermtEmbedding
from kermt.nn.readout import Readout, read_out_families

_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class LatentParams:
    """Gaussian q(z|x) per molecule: ``mean``, ``log_scale`` [M, latent] (log_scale clamped below)."""

    mean: torch.Tensor
    log_scale: torch.Tensor

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """Reparameterised draw z = mean + exp(log_scale)·ε, ε ~ N(0, I): [M, latent]."""
        noise = torch.randn(self.mean.shape, generator=generator, device=self.mean.device, dtype=self.mean.dtype)
        return self.at(noise)

    def at(self, noise: torch.Tensor) -> torch.Tensor:
        """z = mean + exp(log_scale)·``noise`` for given ε [M, latent]."""
        return self.mean + torch.exp(self.log_scale) * noise


class LatentHead(nn.Module):
    """Encoder embeddings -> molecule latent distribution. Holds the encoder as ``kermt`` (shared in hybrid mode).

    Only the mean readout is offered: upstream's self-attention option yields hidden·attn_out features that its
    hidden -> 2·latent projection cannot take (it fails unless attn_out = 1), and no released model uses it.
    """

    def __init__(self, encoder: KermtEmbedding, latent_dim: int, min_log_scale: float = -6.0) -> None:
        super().__init__()
        hidden = encoder.config.hidden_size
        self.kermt = encoder
        self.readout = Readout(hidden, ReadoutConfig(self_attention=False))
        self.fc_mean_logscale = nn.Linear(hidden, 2 * latent_dim)
        self.min_log_scale = min_log_scale

    def pooled_families(self, embeddings: EncoderOutput, graph: BatchMolGraph) -> dict[str, torch.Tensor]:
        """Mean readout [M, hidden] of every family the encoder produced."""
        return read_out_families(self.readout, embeddings, graph)

    def forward(
        self, graph: BatchMolGraph, embeddings: EncoderOutput | None = None,
        depth_rng: np.random.Generator | None = None,
    ) -> LatentParams:
        """Run the encoder (unless ``embeddings`` are given; ``depth_rng`` seeds its depth draws), pool, average the
        families, project."""
        if embeddings is None:
            embeddings = self.kermt(graph, depth_rng)
        pooled = list(self.pooled_families(embeddings, graph).values())
        molecule = sum(pooled) / len(pooled)  # [M, hidden]
        mean, log_scale = self.fc_mean_logscale(molecule).chunk(2, dim=-1)
        return LatentParams(mean=mean, log_scale=log_scale.clamp(min=self.min_log_scale))


class _ScaleGradient(torch.autograd.Function):
    """Identity forward, gradient multiplied by a constant (upstream's ``--normalize_gradient``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def without_own_column(similarity: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """[m, M] -> [m, M - 1]: row i without its column ``own[i]``, the others in order (a molecule's negatives).

    A gather whose indices are computed on the device: selecting with a boolean mask would give the same values,
    but its output size depends on the mask, so the host would wait for the device to learn it.
    """
    rows, count = similarity.shape
    columns = torch.arange(count - 1, device=similarity.device).expand(rows, -1)
    return similarity.gather(1, columns + (columns >= own.unsqueeze(1)))


def _gaussian_log_density(z: torch.Tensor, mean: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    """Σ_d log N(z_d; mean_d, exp(log_scale_d)²): [M, latent] -> [M]."""
    return (-0.5 * ((z - mean) * torch.exp(-log_scale)) ** 2 - log_scale - _HALF_LOG_TWO_PI).sum(dim=-1)


def gaussian_log_densities(params: LatentParams, z: torch.Tensor, normalize_loss: bool = False,
                           normalize_gradient: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(log q(z|x), log P(z)) per molecule [M]: under ``params`` and under the standard normal prior (see
    :func:`cmim_terms` for the two normalisations)."""
    factor = 1.0 / z[0].numel() if z.shape[0] else 1.0
    densities = []
    for mean, log_scale in ((params.mean, params.log_scale), (torch.zeros_like(z), torch.zeros_like(z))):
        value = _gaussian_log_density(z, mean, log_scale)
        if normalize_loss:
            value = value * factor
        if normalize_gradient:
            value = _ScaleGradient.apply(value, factor)
        densities.append(value)
    return densities[0], densities[1]


__all__ = ["LatentHead", "LatentParams", "gaussian_log_densities",
           "without_own_column"]
