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
from kermt.data.operators import OperatorSpec
from kermt.errors import UserError
from kermt.inference.batches import InferenceBatch, run_batches
from kermt.inference.widths import width_rule
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
    still carries the pretrained bond-output branches (upstream files do; ours keep them as passthrough), never
    trained by the finetune, so commands refuse bond fingerprints of it (:meth:`check_source`).
    """

    def __init__(self, checkpoint: Checkpoint, device: torch.device | str = "cpu", *, upstream_batching: bool = False,
                 reference_width: int | None = None) -> None:
        """``upstream_batching`` / ``reference_width``: which neighbour width each molecule is computed at
        (:func:`kermt.inference.widths.width_rule`)."""
        self.path, self.kind = checkpoint.path, checkpoint.spec.kind
        self.rule = width_rule([checkpoint.spec], upstream_batching, reference_width)
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
    def default_source(self) -> FingerprintSource:
        """``--fingerprint_source`` when not given: upstream's ``both``, ``atom`` for a finetuned model."""
        return "atom" if self.kind == "finetuned" else "both"

    def check_source(self, source: FingerprintSource) -> None:
        """Refuse a fingerprint source the model cannot honestly give (commands call this; :meth:`outputs` pools
        whatever families the encoder has, as upstream does, which the parity tests compare)."""
        needed = BRANCHES_BY_OUTPUT_TYPE[source]
        if self.kind == "finetuned" and set(needed) - set(BRANCHES_BY_OUTPUT_TYPE["atom"]):
            raise UserError(
                f"--fingerprint_source {source} needs bond-output branches, but {self.path} is a finetuned model: "
                "finetuning trains only the atom-output branches, so its bond branches are the pretrained weights "
                "(or absent) and say nothing about the finetuned model; use --fingerprint_source atom, or the "
                "pretrained checkpoint for bond fingerprints")
        missing = [f for f in needed if f not in self.families]
        if missing:
            raise UserError(
                f"--fingerprint_source {source} needs the encoder's {', '.join(missing)} output, but {self.path} has "
                "no such output branch; use --fingerprint_source atom")

    @property
    def operators(self) -> OperatorSpec:
        """The neighbour-sum operators batches are collated with."""
        return self.encoder.aggregation_spec(training=False)

    def fingerprints(self, molecules: FeaturizedMolecules, source: FingerprintSource) -> np.ndarray:
        """Valid rows (with ``upstream_batching`` one batch) -> float32 [M, k·hidden (+ features)], upstream's
        ``fps`` rows."""
        return self._one_batch(molecules, source)["fps"]

    def embeddings(self, molecules: FeaturizedMolecules) -> dict[str, np.ndarray]:
        """Valid rows (with ``upstream_batching`` one batch) -> {family: float32 [M, hidden]} (+ ``projected``
        [M, latent] for cMIM/hybrid)."""
        return self._one_batch(molecules, None)

    def outputs(self, molecules: FeaturizedMolecules, batch_size: int,
                source: FingerprintSource | None) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Every batch with valid molecules -> (their rows, outputs): ``{"fps": ...}`` for a fingerprint
        ``source``, else the embeddings; each molecule at its reference width (:mod:`kermt.inference.widths`)."""
        return run_batches(molecules, batch_size, self.operators, _raw_features, self.device,
                           lambda batch: self._launch(batch, source), _on_host,
                           widths=self.rule.widths(molecules.graphs, molecules.valid))

    def _one_batch(self, molecules: FeaturizedMolecules, source: FingerprintSource | None) -> dict[str, np.ndarray]:
        if not molecules.valid.all():
            raise ValueError(f"cannot batch invalid rows: {', '.join(map(str, molecules.invalid[:3]))}")
        out: dict[str, np.ndarray] = {}
        for rows, values in self.outputs(molecules, max(len(molecules), 1), source):
            for name, array in values.items():
                out.setdefault(name, np.zeros((len(molecules), array.shape[1]), np.float32))[rows] = array
        return out

    @torch.no_grad()
    def _launch(self, batch: InferenceBatch, source: FingerprintSource | None) -> dict[str, torch.Tensor]:
        graph = batch.graph
        encoded = self.encoder(graph)
        if source is not None:
            return {"fps": fingerprint_from_embeddings(encoded, graph, self.readout, source, batch.inputs[0])}
        out = read_out_families(self.readout, encoded, graph, self.families)
        if self.latent is not None:
            out["projected"] = self.latent(graph, encoded).mean
        return out

    def output_widths(self) -> dict[str, int]:
        widths = {name: self.hidden_size for name in self.families}
        if self.latent is not None:
            widths["projected"] = self.latent.fc_mean_logscale.out_features // 2
        return widths


def _raw_features(molecules: FeaturizedMolecules) -> tuple[torch.Tensor | None]:
    """The molecules' features as float32 (fingerprints append them unscaled, as upstream), or None."""
    if not molecules.features.shape[1]:
        return (None,)
    return (torch.from_numpy(molecules.features.astype(np.float32)),)


def _on_host(outputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: value.float().cpu().numpy() for name, value in outputs.items()}
