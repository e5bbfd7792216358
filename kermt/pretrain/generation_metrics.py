"""The standard metrics of generated molecules (as MOSES and GuacaMol define them), on RDKit canonical SMILES:

    validity   = valid / generated              (a string is valid when RDKit parses it)
    uniqueness = unique valid / valid           (distinct canonical SMILES among the valid strings)
    novelty    = unique valid not in the reference set / unique valid

A parse rate alone hides a collapsed decoder: 48 copies of one 511-character ``CCCC...`` all parse (validity
100 %) but are one molecule (uniqueness 1/48).

The reference set ("the training set" of the definitions) is the pretraining corpus of the model when a record
beside the checkpoint names it and it can be read (``kermt.pretrain.export.read_corpus_record``; all its molecules,
its validation slice included: the molecules the model may have seen), else the canonical SMILES of the valid
input molecules: then novelty is the share of distinct generated molecules that are none of the inputs.

Molecules are counted by a 64-bit hash of their canonical SMILES, so that the driver of a run over millions of
molecules holds 8 bytes per molecule; two distinct molecules share a hash with probability about n² / 2⁶⁵
(1e-6 for 6 million).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from rdkit import Chem, rdBase

INPUTS_REFERENCE = "the input's molecules"


def canonical_smiles(smiles: str) -> str | None:
    """RDKit's canonical SMILES, None when ``smiles`` does not parse (or is empty)."""
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles) if smiles else None
    return Chem.MolToSmiles(mol) if mol is not None else None


def molecule_keys(canonical: Iterable[str]) -> np.ndarray:
    """uint64 [n]: the hash of each canonical SMILES (stable across processes, unlike Python's ``hash``)."""
    digests = b"".join(hashlib.blake2b(s.encode(), digest_size=8).digest() for s in canonical)
    return np.frombuffer(digests, dtype=np.uint64).copy()


def reference_keys(smiles: Sequence[str], canonical: bool) -> np.ndarray:
    """The sorted distinct keys of a reference set (``canonical``: the strings are already RDKit canonical, as a
    corpus prepared with canonicalisation stores them)."""
    strings = smiles if canonical else [c for c in map(canonical_smiles, smiles) if c is not None]
    return np.unique(molecule_keys(strings))


@dataclass(frozen=True)
class GenerationMetrics:
    generated: int
    valid: int
    unique: int
    novel: int
    reference: str  # what novelty was measured against

    @property
    def validity(self) -> float:
        return self.valid / self.generated if self.generated else float("nan")

    @property
    def uniqueness(self) -> float:
        return self.unique / self.valid if self.valid else float("nan")

    @property
    def novelty(self) -> float:
        return self.novel / self.unique if self.unique else float("nan")

    def line(self) -> str:
        return (f"validity {100 * self.validity:.1f} % ({self.valid} of {self.generated} parse), uniqueness "
                f"{100 * self.uniqueness:.1f} % ({self.unique} distinct molecules), novelty {100 * self.novelty:.1f} % "
                f"({self.novel} not in {self.reference})")


@dataclass
class GenerationTally:
    """Counts and molecule keys accumulated block by block; :meth:`metrics` once every block is in."""

    generated: int = 0
    valid: int = 0
    _generated_keys: list[np.ndarray] = field(default_factory=list)
    _input_keys: list[np.ndarray] = field(default_factory=list)

    def add(self, generated_canonical: Sequence[str | None], input_canonical: Sequence[str]) -> None:
        """One block: the canonical SMILES of each generated string (None: invalid) and of its valid inputs."""
        valid = [s for s in generated_canonical if s is not None]
        self.generated += len(generated_canonical)
        self.valid += len(valid)
        self._generated_keys.append(np.unique(molecule_keys(valid)))
        self._input_keys.append(np.unique(molecule_keys(input_canonical)))

    def metrics(self, reference: np.ndarray | None = None, reference_name: str = INPUTS_REFERENCE
                ) -> GenerationMetrics:
        """``reference``: sorted distinct keys of the training set; None: the inputs seen by :meth:`add`."""
        unique = _distinct(self._generated_keys)
        if reference is None:
            reference, reference_name = _distinct(self._input_keys), INPUTS_REFERENCE
        novel = int((~np.isin(unique, reference, assume_unique=True)).sum())
        return GenerationMetrics(self.generated, self.valid, len(unique), novel, reference_name)


def _distinct(parts: list[np.ndarray]) -> np.ndarray:
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.uint64)


__all__ = ["GenerationMetrics", "GenerationTally", "INPUTS_REFERENCE", "canonical_smiles", "molecule_keys",
           "reference_keys"]
