"""Fingerprints and embeddings of any checkpoint: mean readouts of the encoder's families (upstream's fingerprints
and ``extract_embeddings``) and, for cMIM/hybrid checkpoints, the projected latent mean."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from kermt.checkpoint import Checkpoint, load_into_model, load_pretrain_model
from kermt.checkpoint.keys import BOND_BRANCH_PREFIXES
from kermt.config import ReadoutConfig
from kermt.data.featurize import FeaturizedMolecules
from kermt.errors import UserError
from kermt.nn.encoder import ALL_BRANCHES, BRANCHES_BY_OUTPUT_TYPE, KermtEmbedding
from kermt.nn.fingerprint import FingerprintSource, fingerprint_from_embeddings
from kermt.nn.readout import Readout, read_out_families

FAMILIES = ALL_BRANCHES


class _EncoderOnly(nn.Module):
    """Holds an encoder under ``kermt`` so the strict loader sees the checkpoint's own key names."""

    def __init__(self, encoder: KermtEmbedding) -> None:
        super().__init__()
        self.kermt = encoder


class Embedder:
    """Encoder (+ cMIM latent head) of any checkpoint; mean readouts of each family, as upstream's fingerprints.

    A finetuned model is trained with the atom-output branches only; its bond families exist only when the file
    still carries the pretrained bond-output branches (upstream files do; ours keep them as passthrough).
    """

    def __init__(self, checkpoint: Checkpoint, device: torch.device | str = "cpu") -> None:
        self.path = checkpoint.path
        self.device = torch.device(device)
        self.latent = None
        if checkpoint.spec.kind in ("cmim", "hybrid"):
            model, _ = load_pretrain_model(checkpoint)
            self.encoder, self.latent = model.encoder, model.latent_dist
        else:
            self.encoder = self._encoder_only(checkpoint)
        self.encoder.to(self.device).eval()
        if self.latent is not None:
            self.latent.to(self.device).eval()
        hidden = self.encoder.config.hidden_size
        self.readout = Readout(hidden, ReadoutConfig(self_attention=False)).to(self.device)
        self.families = tuple(f for f in FAMILIES if f in self.encoder.encoders.branches)
        self.hidden_size = hidden

    @staticmethod
    def _encoder_only(checkpoint: Checkpoint) -> KermtEmbedding:
        source = {k: v for k, v in {**checkpoint.state_dict, **checkpoint.passthrough}.items()
                  if k.startswith("kermt.")}
        has_bond = any(k.startswith(BOND_BRANCH_PREFIXES) for k in source)
        config = dataclasses.replace(checkpoint.spec.encoder, embedding_output_type="both" if has_bond else "atom")
        holder = _EncoderOnly(KermtEmbedding(config))
        load_into_model(holder, source)
        return holder.kermt

    @property
    def has_latent(self) -> bool:
        return self.latent is not None

    def check_source(self, source: FingerprintSource) -> None:
        needed = BRANCHES_BY_OUTPUT_TYPE[source]
        missing = [f for f in needed if f not in self.families]
        if missing:
            raise UserError(
                f"--fingerprint_source {source} needs the encoder's {', '.join(missing)} output, but {self.path} has "
                "no bond-output branches (a finetuned model built without them); use --fingerprint_source atom")

    @torch.no_grad()
    def fingerprints(self, molecules: FeaturizedMolecules, source: FingerprintSource) -> np.ndarray:
        """One batch of valid rows -> float32 [M, k·hidden (+ features)], upstream's ``fps`` rows."""
        graph = molecules.batch_graph().to(self.device)
        features = None
        if molecules.features.shape[1]:
            features = torch.from_numpy(molecules.features.astype(np.float32)).to(self.device)
        fps = fingerprint_from_embeddings(self.encoder(graph), graph, self.readout, source, features)
        return fps.float().cpu().numpy()

    @torch.no_grad()
    def embeddings(self, molecules: FeaturizedMolecules) -> dict[str, np.ndarray]:
        """One batch of valid rows -> {family: float32 [M, hidden]} (+ ``projected`` [M, latent] for cMIM/hybrid)."""
        graph = molecules.batch_graph().to(self.device)
        encoded = self.encoder(graph)
        out = read_out_families(self.readout, encoded, graph, self.families)
        if self.latent is not None:
            out["projected"] = self.latent(graph, encoded).mean
        return {name: value.float().cpu().numpy() for name, value in out.items()}

    def output_widths(self) -> dict[str, int]:
        widths = {name: self.hidden_size for name in self.families}
        if self.latent is not None:
            widths["projected"] = self.latent.fc_mean_logscale.out_features // 2
        return widths
