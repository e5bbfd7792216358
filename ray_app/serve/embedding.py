"""``"embed": true``: each molecule's readout embedding, the vectors `kermt embed --checkpoint_path MEMBER_0` writes.

Which vectors: member 0's encoder, mean readout of each atom-output family (``atom_from_atom`` then
``atom_from_bond``, concatenated: 2 x hidden size floats), :class:`kermt.inference.Embedder`'s code and batches.
Member 0 because an ensemble has no one embedding (each member has its own space; the applicability domain reads
member 0's too). Only the atom-output families because finetuning trains only those: a finetuned file's bond
families are the pretrained weights (or absent), which is also why `kermt fingerprint` refuses a bond source for a
finetuned model.

The encoder is loaded on the first request that asks (a replica that never embeds never holds a second copy of
the weights), once per replica.
"""

from __future__ import annotations

import threading

import numpy as np

from kermt.checkpoint import Checkpoint
from kermt.data.featurize import FeaturizedMolecules
from kermt.nn.encoder import BRANCHES_BY_OUTPUT_TYPE

EMBEDDING_COLUMN = "embedding"
EMBEDDING_FAMILIES = BRANCHES_BY_OUTPUT_TYPE["atom"]  # ("atom_from_atom", "atom_from_bond")


def embedding_size(member_0: Checkpoint) -> int:
    """Floats per molecule in ``embedding`` (GET /models)."""
    return len(EMBEDDING_FAMILIES) * member_0.spec.encoder.hidden_size


class MemberEmbedding:
    """In a model replica: member 0's Embedder, built on first use (a lock: batches run in worker threads)."""

    def __init__(self, member_0: Checkpoint, device: str, reference_width: int | None = None) -> None:
        """``reference_width``: the ensemble's (its members' largest), so the embedding is read at its widths."""
        self.member_0, self.device, self.reference_width = member_0, device, reference_width
        self._embedder = None
        self._lock = threading.Lock()

    def _loaded(self):
        from kermt.inference import Embedder

        with self._lock:
            if self._embedder is None:
                self._embedder = Embedder(self.member_0, self.device, reference_width=self.reference_width)
            return self._embedder

    def __call__(self, molecules: FeaturizedMolecules, batch_size: int) -> dict[str, list]:
        """``{"embedding": [list of floats, or None for an invalid molecule, per row]}``."""
        embedder = self._loaded()
        width = embedding_size(self.member_0)
        out = np.full((len(molecules), width), np.nan, np.float32)
        for rows, values in embedder.outputs(molecules, batch_size, None):
            out[rows] = np.concatenate([values[family] for family in EMBEDDING_FAMILIES], axis=1)
        valid = molecules.valid
        return {EMBEDDING_COLUMN: [row.tolist() if ok else None for row, ok in zip(out.astype(float), valid)]}


__all__ = ["EMBEDDING_COLUMN", "EMBEDDING_FAMILIES", "MemberEmbedding", "embedding_size"]
