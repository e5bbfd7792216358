"""Per-batch targets of the vocab pretraining task (docs/upstream-compatibility.md#pretraining).

Labels are laid out like the batch graph: a leading 0 for the padding row, then every atom of every molecule
(atom order), resp. every chemical bond (pair order, one label per bond, not per directed edge). 0 means "not
labelled" and is ignored by the loss.

Upstream labels a random 15 % of the atoms and bonds of each molecule; the inputs are NOT masked. Its draws are
``np.random.permutation(n)[:ceil(0.15·n)]`` on the global NumPy RNG, first for every molecule's atoms, then for every
molecule's bonds. :func:`sample_vocab_labels` consumes an explicit RNG in exactly that order, so passing
``np.random.RandomState(s)`` reproduces upstream after ``np.random.seed(s)`` draw for draw (a
``np.random.Generator`` works too, with a different stream).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from rdkit import Chem

from kermt.chem.vocab_context import ContextVocab

DEFAULT_LABEL_FRACTION = 0.15


class PermutationRng(Protocol):
    """What the draws need: ``np.random.RandomState`` and ``np.random.Generator`` both qualify."""

    def permutation(self, x: int) -> np.ndarray: ...


@dataclass(frozen=True)
class VocabLabels:
    """Atom labels ``atom`` [1 + atoms] and bond labels ``bond`` [1 + bonds], int64, index 0 = padding."""

    atom: np.ndarray
    bond: np.ndarray


def _parse(smiles: Sequence[str]) -> list[Chem.Mol]:
    mols = [Chem.MolFromSmiles(smi) for smi in smiles]
    bad = [smi for smi, mol in zip(smiles, mols) if mol is None]
    if bad:
        raise ValueError(f"RDKit cannot parse {len(bad)} SMILES, e.g. {bad[0]!r}")
    return mols


def _with_padding(per_molecule: list[list[int]]) -> np.ndarray:
    return np.fromiter((x for labels in [[0], *per_molecule] for x in labels), dtype=np.int64)


def all_vocab_labels(smiles: Sequence[str], atom_vocab: ContextVocab, bond_vocab: ContextVocab) -> VocabLabels:
    """Every atom and bond labelled (no sampling)."""
    mols = _parse(smiles)
    return VocabLabels(
        atom=_with_padding([atom_vocab.labels(mol) for mol in mols]),
        bond=_with_padding([bond_vocab.labels(mol) for mol in mols]),
    )


def _keep_random_subset(labels: list[int], fraction: float, rng: PermutationRng) -> list[int]:
    # math.ceil of the float product, as upstream computes it (not an integer formula), so counts agree for any
    # fraction.
    n = len(labels)
    chosen = rng.permutation(n)[: math.ceil(n * fraction)]
    kept = [0] * n
    for i in chosen:
        kept[i] = labels[i]
    return kept


def sample_vocab_labels(
    smiles: Sequence[str],
    atom_vocab: ContextVocab,
    bond_vocab: ContextVocab,
    rng: PermutationRng,
    fraction: float = DEFAULT_LABEL_FRACTION,
) -> VocabLabels:
    """Label ``ceil(fraction · n)`` random atoms and bonds per molecule; the rest get 0 (upstream's order of draws)."""
    mols = _parse(smiles)
    atom = [_keep_random_subset(atom_vocab.labels(mol), fraction, rng) for mol in mols]
    bond = [_keep_random_subset(bond_vocab.labels(mol), fraction, rng) for mol in mols]
    return VocabLabels(atom=_with_padding(atom), bond=_with_padding(bond))


__all__ = ["DEFAULT_LABEL_FRACTION", "PermutationRng", "VocabLabels", "all_vocab_labels", "sample_vocab_labels"]
