"""SMILES Transformer decoder of cMIM pretraining and its teacher-forced reconstruction loss.

Upstream behaviour: docs/upstream-compatibility.md#pretraining.

The memory is the molecule latent as one token [B, 1, latent_dim]; the decoder width equals latent_dim. Keys equal
upstream's ``decoder.*``: ``token_embedding``, ``decoder_layers.{i}.*`` (RoPE) or ``pos_encoder.pe`` +
``transformer_decoder.layers.{i}.*`` (sinusoidal, PyTorch's own layers), ``output_projection``.

Dropout over [B, L, d] token tensors keys its rows by molecule (columns: token position x feature), so the RoPE
decoder can draw per molecule (:mod:`kermt.nn.keyed_dropout`); PyTorch's own layers of the sinusoidal decoder
always draw from torch's RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from kermt.nn.pretrain.decoder_layers import RopeDecoderLayer, SinusoidalPositionalEncoding
from kermt.nn.keyed_dropout import Dropout
from kermt.nn.pretrain.config import PretrainHeadsConfig

PAD_TOKEN = 0


class SmilesDecoder(nn.Module):
    """Token ids [B, L] + memory [B, M, d] -> next-token logits [B, L, vocab] (causal)."""

    def __init__(self, config: PretrainHeadsConfig) -> None:
        super().__init__()
        d_model, vocab_size = config.latent_dim, config.smiles_vocab_size
        self.d_model = d_model
        self.positional_encoding = config.decoder_positional_encoding
        self.token_embedding = nn.Embedding(vocab_size, d_model, padding_idx=PAD_TOKEN)
        if self.positional_encoding == "rope":
            self.input_dropout = Dropout(config.decoder_dropout, "molecule")
            self.decoder_layers = nn.ModuleList(
                RopeDecoderLayer(
                    d_model, config.decoder_num_attention_heads, config.decoder_ffn_hidden_size,
                    config.decoder_dropout, config.decoder_gate_self_attn, config.decoder_gate_cross_attn,
                )
                for _ in range(config.decoder_num_layers)
            )
        else:
            self.pos_encoder = SinusoidalPositionalEncoding(d_model, config.decoder_dropout, config.decoder_max_seq_len)
            layer = nn.TransformerDecoderLayer(
                d_model, config.decoder_num_attention_heads, config.decoder_ffn_hidden_size,
                config.decoder_dropout, activation="relu", batch_first=True,
            )
            self.transformer_decoder = nn.TransformerDecoder(layer, config.decoder_num_layers)
        self.output_projection = nn.Linear(d_model, vocab_size)
        # Upstream re-initialises these two (the whole embedding table, padding row included).
        nn.init.xavier_normal_(self.token_embedding.weight)
        nn.init.xavier_normal_(self.output_projection.weight)
        nn.init.zeros_(self.output_projection.bias)

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        """tokens [B, L] int64; memory [B, M, d]; padding_mask [B, L] bool, True = padding key (may be None)."""
        x = self.token_embedding(tokens) * math.sqrt(self.d_model)
        length = tokens.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
        if self.positional_encoding == "rope":
            allowed = causal[None, None]  # [1, 1, L, L]
            if padding_mask is not None:
                allowed = allowed & ~padding_mask[:, None, None, :]  # [B, 1, L, L]
            x = self.input_dropout(x)
            for layer in self.decoder_layers:
                x = layer(x, memory, allowed)
        else:
            x = self.transformer_decoder(
                self.pos_encoder(x), memory, tgt_mask=~causal, tgt_key_padding_mask=padding_mask
            )
        return self.output_projection(x)


@torch.no_grad()
def greedy_decode(decoder: SmilesDecoder, z: torch.Tensor, max_len: int, start: int = 1, end: int = 2) -> torch.Tensor:
    """Most likely token at each step given latents ``z`` [B, latent] -> ids [B, <= max_len] starting with ``start``;
    positions after a sequence's ``end`` are padding. Re-runs the prefix each step (no cache): O(max_len²), meant
    for inspection and reconstruction checks, not bulk generation."""
    tokens = torch.full((z.shape[0], 1), start, dtype=torch.long, device=z.device)
    finished = torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
    while tokens.shape[1] < max_len and not bool(finished.all()):
        next_token = decoder(tokens, z.unsqueeze(1), None)[:, -1].argmax(dim=-1)
        next_token = next_token.masked_fill(finished, PAD_TOKEN)
        tokens = torch.cat([tokens, next_token.unsqueeze(1)], dim=1)
        finished |= next_token == end
    return tokens


@dataclass(frozen=True)
class TeacherForcing:
    """Decoder input ``tokens[:, :-1]``, target ``tokens[:, 1:]`` and the TARGET's padding mask (True = pad), all
    [B, L-1] — upstream passes the target's mask as the key-padding mask of the input positions."""

    inputs: torch.Tensor
    targets: torch.Tensor
    padding_mask: torch.Tensor

    @classmethod
    def from_tokens(cls, tokens: torch.Tensor) -> "TeacherForcing":
        """tokens [B, L]: ``<start> … <end>`` right-padded with 0."""
        targets = tokens[:, 1:]
        return cls(inputs=tokens[:, :-1], targets=targets, padding_mask=targets == PAD_TOKEN)


@dataclass(frozen=True)
class Reconstruction:
    """Per-sample mean token cross-entropy ``loss`` [B] and token accuracy ``accuracy`` [B] over non-pad targets."""

    loss: torch.Tensor
    accuracy: torch.Tensor


def reconstruction_terms(logits: torch.Tensor, targets: torch.Tensor, padding_mask: torch.Tensor) -> Reconstruction:
    """logits [B, L, V], targets [B, L], padding_mask [B, L] (True = pad) -> per-sample loss and accuracy."""
    valid = (~padding_mask).to(logits.dtype)
    token_ce = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=PAD_TOKEN, reduction="none")
    counts = valid.sum(dim=1).clamp(min=1.0)
    correct = (logits.argmax(dim=-1) == targets).to(logits.dtype)
    return Reconstruction(loss=(token_ce * valid).sum(dim=1) / counts, accuracy=(correct * valid).sum(dim=1) / counts)


__all__ = ["PAD_TOKEN", "Reconstruction", "SmilesDecoder", "TeacherForcing", "greedy_decode", "reconstruction_terms"]
