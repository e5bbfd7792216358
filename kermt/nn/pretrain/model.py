"""KermtPretrainModel: encoder + vocab heads ("vocab"), latent head + SMILES decoder ("cmim"), or both ("hybrid").

The module tree reproduces upstream's ``KermtTask`` / ``KermtCMIMTask`` / ``KermtHybridTask`` state_dicts key for
key, in the same order:

    vocab:  kermt.*, vocab_module.*
    cmim:   latent_dist.{kermt,readout,fc_mean_logscale}.*, decoder.*
    hybrid: kermt.*, latent_dist.{kermt,readout,fc_mean_logscale}.*, decoder.*, vocab_module.*

In hybrid mode ``kermt`` and ``latent_dist.kermt`` are ONE module, so the state_dict lists the encoder twice (as
upstream's files do) while ``parameters()`` yields it once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kermt.config import EncoderConfig
from kermt.data.batch import BatchMolGraph
from kermt.data.prefetch import transfer_fields
from kermt.nn.pretrain.decoder import SmilesDecoder, TeacherForcing
from kermt.nn.encoder import KermtEmbedding
from kermt.nn.pretrain.cmim import LatentHead, LatentParams
from kermt.nn.pretrain.config import PretrainHeadsConfig
from kermt.nn.pretrain.vocab_heads import VocabHeads, VocabPredictions, VocabTargets


@dataclass(frozen=True)
class PretrainBatch:
    """One pretraining batch: the graph, vocab targets (vocab / hybrid) and SMILES token ids [B, L] (cmim / hybrid,
    ``<start> … <end>`` right-padded with 0). ``latent_noise`` [B, latent_dim]: the ε of each molecule's
    reparameterised latent draw, when the caller draws it per molecule (None: drawn inside the forward)."""

    graph: BatchMolGraph
    vocab_targets: VocabTargets | None = None
    tokens: torch.Tensor | None = None
    latent_noise: torch.Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "PretrainBatch":
        """The batch on ``device``; ``non_blocking`` copies asynchronously (from pinned memory)."""
        return transfer_fields(self, _PARTS, device, non_blocking)

    def pin_memory(self) -> "PretrainBatch":
        """The batch in page-locked host memory (see :func:`kermt.data.prefetch.prefetch`)."""
        return transfer_fields(self, _PARTS, None, False)


_PARTS = ("graph", "vocab_targets", "tokens", "latent_noise")  # every field of PretrainBatch


@dataclass(frozen=True)
class PretrainOutput:
    """What the loss needs. ``vocab``: vocab-head predictions; ``latent``: q(z|x); ``z`` [M, latent]: the latent the
    decoder was conditioned on; ``decoder_logits`` [M, L-1, V] for ``teacher``'s inputs."""

    vocab: VocabPredictions | None = None
    latent: LatentParams | None = None
    z: torch.Tensor | None = None
    decoder_logits: torch.Tensor | None = None
    teacher: TeacherForcing | None = None

    def in_float32(self) -> "PretrainOutput":
        """Every floating tensor as float32: what the losses read after a bf16 forward (kermt.nn.precision)."""
        return _in_float32(self)


def _in_float32(value):
    """``value`` with every floating tensor in it (dataclass fields, recursively) cast to float32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: _in_float32(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    return value


class KermtPretrainModel(nn.Module):
    """Pretraining model in upstream's layout (see the module docstring for its keys)."""

    def __init__(self, encoder: EncoderConfig, heads: PretrainHeadsConfig) -> None:
        super().__init__()
        self.encoder_config = encoder
        self.heads_config = heads
        hidden = encoder.hidden_size
        if heads.uses_vocab:
            self.kermt = KermtEmbedding(encoder)
        if heads.uses_decoder:
            shared = self.kermt if heads.pretrain_mode == "hybrid" else KermtEmbedding(encoder)
            self.latent_dist = LatentHead(shared, heads.latent_dim, heads.min_log_scale)
            self.decoder = SmilesDecoder(heads)
        if heads.uses_vocab:
            self.vocab_module = VocabHeads(hidden, heads.atom_vocab_size, heads.bond_vocab_size, heads.fg_size)

    @property
    def encoder(self) -> KermtEmbedding:
        """The (only) encoder, whichever attribute holds it."""
        return self.kermt if self.heads_config.uses_vocab else self.latent_dist.kermt

    def forward(
        self,
        batch: PretrainBatch,
        sample_latent: bool = True,
        generator: torch.Generator | None = None,
        depth_rng: np.random.Generator | None = None,
    ) -> PretrainOutput:
        """Run the heads of this mode. ``sample_latent=False`` conditions the decoder on the latent mean instead of a
        reparameterised draw (deterministic; what evaluation and embedding want); ``generator`` seeds the draw
        unless ``batch.latent_noise`` gives it. ``depth_rng`` seeds the train-mode depth draws of every encoder
        pass, in forward order (None: numpy's global RNG, as upstream)."""
        heads = self.heads_config
        graph = batch.graph
        embeddings = self.kermt(graph, depth_rng) if heads.uses_vocab else None
        vocab = self.vocab_module(embeddings, graph) if heads.uses_vocab else None
        if not heads.uses_decoder:
            return PretrainOutput(vocab=vocab)
        if batch.tokens is None:
            raise ValueError(f"pretrain_mode {heads.pretrain_mode!r} needs batch.tokens for the SMILES decoder")
        reuse = embeddings if heads.hybrid_single_encoder_pass else None
        latent = self.latent_dist(graph, reuse, depth_rng)
        if not sample_latent:
            z = latent.mean
        else:
            z = latent.sample(generator) if batch.latent_noise is None else latent.at(batch.latent_noise)
        teacher = TeacherForcing.from_tokens(batch.tokens)
        logits = self.decoder(teacher.inputs, z.unsqueeze(1), teacher.padding_mask)
        return PretrainOutput(vocab=vocab, latent=latent, z=z, decoder_logits=logits, teacher=teacher)


__all__ = ["KermtPretrainModel", "PretrainBatch", "PretrainOutput"]
