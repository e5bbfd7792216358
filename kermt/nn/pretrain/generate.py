"""Autoregressive SMILES generation with the cMIM decoder: greedy, temperature, top-k and top-p sampling.

Every sequence of a batch is decoded in lockstep from ``<start>``; a sequence that produced ``<end>`` leaves the
forward pass (its later positions are padding), so one long sequence never makes the others pay for its length.
Rows never interact in the decoder, so a sequence's tokens do not depend on which others share its batch.

Sampling takes its randomness from the caller as one uniform number per sequence and step (``uniforms(step)``),
turned into a token by inverting the cumulative distribution of the filtered softmax. Keying those numbers on the
molecule (see ``kermt.pretrain.reconstruct``) makes the samples independent of batching, workers and device.
Upstream (``task/reconstruct.py``) decodes one molecule at a time with ``torch.multinomial`` on the global RNG;
the filters are the same (top-k keeps ties with the k-th logit; top-p drops a token when the tokens more likely
than it already hold more than p of the probability).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kermt.chem.vocab_smiles import END, PAD, START
from kermt.nn.pretrain.decoder import SmilesDecoder

Uniforms = Callable[[int], torch.Tensor]  # step t -> uniform [0, 1) numbers [B], one per sequence


@dataclass(frozen=True)
class SamplingConfig:
    """``temperature`` 0 is greedy decoding; ``top_k`` / ``top_p`` None keep every token; ``max_len`` counts
    ``<start>`` (upstream's meaning: at most ``max_len - 1`` generated tokens)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_len: int = 512

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 (<start> and one token), got {self.max_len}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filtered_probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """logits [B, V] -> probabilities [B, V] after temperature, top-k and top-p (filtered tokens exactly 0)."""
    logits = logits.float() / config.temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1)
        mass_before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=-1)
        drop_ordered = mass_before > config.top_p
        logits = logits.masked_fill(drop_ordered.scatter(-1, order, drop_ordered), float("-inf"))
    return torch.softmax(logits, dim=-1)


def next_tokens(logits: torch.Tensor, uniforms: torch.Tensor | None, config: SamplingConfig) -> torch.Tensor:
    """logits [B, V] of the last position -> token ids [B]: the argmax when greedy, else the token whose
    cumulative-probability interval holds ``uniforms`` [B]."""
    if config.greedy:
        return logits.argmax(dim=-1)
    probabilities = filtered_probabilities(logits, config)
    cumulative = torch.cumsum(probabilities, dim=-1)
    threshold = uniforms.to(cumulative) * cumulative[:, -1]
    chosen = torch.searchsorted(cumulative, threshold.unsqueeze(1), right=True).squeeze(1)
    # u·total can round up to total: fall back to the last token that has any probability (never a filtered one)
    last_allowed = probabilities.shape[-1] - 1 - (probabilities > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(chosen, last_allowed)


@torch.no_grad()
def generate(decoder: SmilesDecoder, z: torch.Tensor, config: SamplingConfig,
             uniforms: Uniforms | None = None) -> torch.Tensor:
    """Token ids [B, <= max_len] for latents ``z`` [B, latent]: ``<start>``, the generated tokens, ``<end>`` when
    reached, then padding. ``uniforms`` is required unless ``config.greedy``.

    Like ``kermt.nn.pretrain.decoder.greedy_decode`` the prefix is re-run at every step (no key/value cache)."""
    if not config.greedy and uniforms is None:
        raise ValueError("sampling (temperature > 0) needs uniforms(step)")
    _check_length(decoder, config.max_len)
    count = z.shape[0]
    tokens = torch.full((count, config.max_len), PAD, dtype=torch.long, device=z.device)
    tokens[:, 0] = START
    active = torch.arange(count, device=z.device)
    length = 1
    while length < config.max_len and len(active):
        logits = decoder(tokens[active, :length], z[active].unsqueeze(1), None)[:, -1]
        draws = None if config.greedy else uniforms(length)[active.cpu()].to(z.device)
        chosen = next_tokens(logits, draws, config)
        tokens[active, length] = chosen
        active = active[chosen != END]
        length += 1
    return tokens[:, :length]


def _check_length(decoder: SmilesDecoder, max_len: int) -> None:
    """A sinusoidal decoder has positions only up to its training length."""
    if decoder.positional_encoding == "sinusoidal":
        positions = decoder.pos_encoder.pe.shape[0]
        if max_len > positions:
            raise ValueError(f"max_len {max_len} exceeds the sinusoidal decoder's {positions} positions")


__all__ = ["SamplingConfig", "Uniforms", "filtered_probabilities", "generate", "next_tokens"]
