"""Molecule fingerprints: concatenated mean readouts of the encoder's embedding families.

Upstream behaviour: docs/upstream-compatibility.md#prediction-fingerprints-and-embeddings.

``source`` "atom" -> [atom_from_atom, atom_from_bond], "bond" -> [bond_from_atom, bond_from_bond], "both" -> all four
in the order [aa, ab, ba, bb] (upstream's ``main.py fingerprint``), each [M, hidden]; optional molecule features are
appended after them. The readout is always the mean, whatever readout a finetuned model was trained with.
"""

from __future__ import annotations

import torch
from torch import nn

from kermt.config import ReadoutConfig
from kermt.data.batch import BatchMolGraph
from kermt.nn.encoder import BRANCHES_BY_OUTPUT_TYPE, EncoderOutput, KermtEmbedding
from kermt.nn.readout import Readout, read_out_families
from kermt.registry import FingerprintSource


def fingerprint_from_embeddings(
    embeddings: EncoderOutput,
    graph: BatchMolGraph,
    readout: Readout,
    source: FingerprintSource = "both",
    features: torch.Tensor | None = None,
) -> torch.Tensor:
    """[M, k·hidden (+ n_features)] with k = 2 ("atom", "bond") or 4 ("both"); ``readout`` must be a mean readout."""
    if readout.config.self_attention:
        raise ValueError("fingerprints use a mean readout")
    names = BRANCHES_BY_OUTPUT_TYPE[source]
    pooled = read_out_families(readout, embeddings, graph, names)
    missing = [name for name in names if name not in pooled]
    if missing:
        raise ValueError(f"fingerprint source {source!r} needs the encoder's {missing[0]} output, which was not built")
    parts = [pooled[name] for name in names]
    if features is not None:
        # explicit width: reshape(M, -1) is ambiguous (an error) for an empty batch (M = 0)
        parts.append(features.to(parts[0].dtype).reshape(parts[0].shape[0], features.shape[-1]))
    return torch.cat(parts, dim=1)


class KermtFingerprint(nn.Module):
    """Encoder + mean readout (keys ``kermt.*``, ``readout.cached_zero_vector``, as upstream's fingerprint model)."""

    def __init__(self, encoder: KermtEmbedding, source: FingerprintSource = "both") -> None:
        super().__init__()
        if source not in BRANCHES_BY_OUTPUT_TYPE:
            raise ValueError(f"fingerprint source {source!r} must be one of {tuple(BRANCHES_BY_OUTPUT_TYPE)}")
        self.kermt = encoder
        self.readout = Readout(encoder.config.hidden_size, ReadoutConfig(self_attention=False))
        self.source = source

    def forward(self, graph: BatchMolGraph, features: torch.Tensor | None = None) -> torch.Tensor:
        return fingerprint_from_embeddings(self.kermt(graph), graph, self.readout, self.source, features)


__all__ = ["FingerprintSource", "KermtFingerprint", "fingerprint_from_embeddings"]
