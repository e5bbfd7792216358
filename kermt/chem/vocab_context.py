"""Contextual atom / bond vocabularies of GROVER-style pretraining (docs/upstream-compatibility.md#pretraining).

An atom's *context* is its symbol plus the multiset of (neighbour symbol, bond type) pairs; a bond's context is its
(type, stereo, direction) descriptor plus the bonds hanging off either end. The vocabulary maps each context string
to an integer class; index 0 is padding ("not labelled") and index 1 collects every context outside the vocab.

Strings, ordering and the JSON layout are upstream's, so upstream vocab files load here and labels agree id for id.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from rdkit import Chem

from kermt.chem.vocab_pickle import read_pickled_vocab

VocabKind = Literal["atom", "bond"]
CONTEXT_SPECIALS = ("<pad>", "<other>")
PAD_INDEX = 0
OTHER_INDEX = 1


def bond_descriptor(bond: Chem.Bond) -> str:
    """``"(SINGLE-STEREONONE-NONE)"``: RDKit enum names of bond type, stereo and direction."""
    return f"({bond.GetBondType()}-{bond.GetStereo()}-{bond.GetBondDir()})"


def _join_context(head: str, counts: Counter) -> str:
    # Keys sorted as plain strings, each followed by its count: "C_C-SINGLE1_O-SINGLE1".
    return head + "".join(f"_{key}{counts[key]}" for key in sorted(counts))


def atom_context(mol: Chem.Mol, atom: Chem.Atom) -> str:
    """Context string of ``atom``, e.g. ethanol's CH2 -> ``"C_C-SINGLE1_O-SINGLE1"``."""
    return _atom_contexts(mol)[atom.GetIdx()]


def bond_context(mol: Chem.Mol, bond: Chem.Bond) -> str:
    """Context string of ``bond``: its descriptor, then ``"<end symbol>-<descriptor>"`` of every other bond at
    either end (the bond itself excluded; two atoms share at most one bond)."""
    return _bond_contexts(mol)[bond.GetIdx()]


# Whole-molecule passes: every bond's type / descriptor and every atom's symbol is read from RDKit once and shared
# by all the contexts that mention it (per-atom and per-bond RDKit iteration cost several times more, and a
# corpus computes these strings for tens of millions of atoms and bonds).

def _atom_contexts(mol: Chem.Mol) -> list[str]:
    """Contexts of all atoms, in atom index order."""
    symbols = [atom.GetSymbol() for atom in mol.GetAtoms()]
    counts: list[Counter] = [Counter() for _ in symbols]
    for bond in mol.GetBonds():
        i, j, kind = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx(), str(bond.GetBondType())
        counts[i][f"{symbols[j]}-{kind}"] += 1
        counts[j][f"{symbols[i]}-{kind}"] += 1
    return [_join_context(symbol, c) for symbol, c in zip(symbols, counts)]


def _bond_contexts(mol: Chem.Mol) -> list[str]:
    """Contexts of all bonds, in RDKit bond index order."""
    symbols = [atom.GetSymbol() for atom in mol.GetAtoms()]
    bonds = list(mol.GetBonds())
    ends = [(bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()) for bond in bonds]
    descriptors = [bond_descriptor(bond) for bond in bonds]
    at_atom: list[list[int]] = [[] for _ in symbols]
    for k, (i, j) in enumerate(ends):
        at_atom[i].append(k)
        at_atom[j].append(k)
    out = []
    for k, (i, j) in enumerate(ends):
        counts: Counter = Counter()
        for end in (i, j):
            for other in at_atom[end]:
                if other != k:
                    counts[f"{symbols[end]}-{descriptors[other]}"] += 1
        out.append(_join_context(descriptors[k], counts))
    return out


def _pair(bond: Chem.Bond) -> tuple[int, int]:
    i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
    return (i, j) if i < j else (j, i)


def bonds_in_pair_order(mol: Chem.Mol) -> list[Chem.Bond]:
    """Chemical bonds ordered by (lower atom index, higher atom index).

    This is the order upstream's MolGraph enumerates bonds in (``for a1: for a2 > a1``), hence the order of bond
    labels and of the directed-edge pairs (2k+1, 2k+2) in a batch; sorting avoids the O(n_atoms²) double loop.
    """
    return sorted(mol.GetBonds(), key=_pair)


def contexts(mol: Chem.Mol, kind: VocabKind) -> list[str]:
    """Context strings of every atom (atom order) or every bond (pair order, see :func:`bonds_in_pair_order`)."""
    if kind == "atom":
        return _atom_contexts(mol)
    by_index = _bond_contexts(mol)
    return [by_index[bond.GetIdx()] for bond in bonds_in_pair_order(mol)]


@dataclass(frozen=True)
class ContextVocab:
    """Context-string vocabulary. ``itos[0] = "<pad>"``, ``itos[1] = "<other>"``, then tokens by count descending
    (ties alphabetical). ``freqs`` holds the counts the vocab was built from (kept for upstream's file layout)."""

    kind: VocabKind
    itos: tuple[str, ...]
    freqs: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("atom", "bond"):
            raise ValueError(f"vocab kind must be 'atom' or 'bond', got {self.kind!r}")
        if tuple(self.itos[:2]) != CONTEXT_SPECIALS:
            raise ValueError(f"a context vocab starts with {CONTEXT_SPECIALS}, got {tuple(self.itos[:2])}")
        if len(set(self.itos)) != len(self.itos):
            raise ValueError("context vocab has duplicate tokens")

    @cached_property
    def stoi(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def index(self, context: str) -> int:
        """Class id of a context string; unseen contexts map to ``OTHER_INDEX``."""
        return self.stoi.get(context, OTHER_INDEX)

    def labels(self, mol: Chem.Mol) -> list[int]:
        """Class id of every atom / bond of ``mol`` (bond labels in pair order)."""
        return [self.index(c) for c in contexts(mol, self.kind)]

    @classmethod
    def from_counts(
        cls, counts: Mapping[str, int], kind: VocabKind, max_size: int | None = None, min_freq: int = 1
    ) -> "ContextVocab":
        """Keep tokens with count >= ``min_freq`` (at least 1), at most ``max_size`` of them besides the specials."""
        min_freq = max(min_freq, 1)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        kept = [token for token, count in ranked if count >= min_freq]
        if max_size is not None:
            kept = kept[:max_size]
        return cls(kind=kind, itos=CONTEXT_SPECIALS + tuple(kept), freqs=dict(counts))

    @classmethod
    def build(
        cls, smiles: Iterable[str], kind: VocabKind, max_size: int | None = None, min_freq: int = 1
    ) -> "ContextVocab":
        """Count contexts over all molecules; SMILES RDKit cannot parse are skipped (as upstream does)."""
        counts: Counter = Counter()
        for smi in smiles:
            mol = Chem.MolFromSmiles(smi)
            if mol is not None:
                counts.update(contexts(mol, kind))
        return cls.from_counts(counts, kind, max_size=max_size, min_freq=min_freq)

    def to_dict(self) -> dict[str, Any]:
        """Upstream's JSON layout (``MolVocab.to_dict``)."""
        return {
            "freqs": dict(self.freqs),
            "itos": list(self.itos),
            "stoi": dict(self.stoi),
            "vocab_type": self.kind,
            "other_index": OTHER_INDEX,
            "pad_index": PAD_INDEX,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ContextVocab":
        """Parse upstream's JSON layout, checking that ``stoi`` and the special indices agree with ``itos``."""
        itos = tuple(data["itos"])
        vocab = cls(kind=data["vocab_type"], itos=itos, freqs=dict(data.get("freqs", {})))
        stoi = data.get("stoi")
        if stoi is not None and dict(stoi) != vocab.stoi:
            raise ValueError("vocab file is inconsistent: 'stoi' is not the inverse of 'itos'")
        if data.get("pad_index", PAD_INDEX) != PAD_INDEX or data.get("other_index", OTHER_INDEX) != OTHER_INDEX:
            raise ValueError("vocab file uses special indices other than pad=0, other=1")
        return vocab

    @classmethod
    def load(cls, path: str | Path) -> "ContextVocab":
        """Read a vocab file: JSON (upstream's default), or an upstream ``.pkl`` ``MolVocab`` read as plain data
        through :mod:`kermt.chem.vocab_pickle` (no upstream code is imported or run)."""
        path = Path(path)
        if path.suffix in (".pkl", ".pckl"):
            return cls.from_dict(read_pickled_vocab(path).state)
        return cls.from_dict(json.loads(path.read_text()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))


__all__ = [
    "CONTEXT_SPECIALS",
    "ContextVocab",
    "OTHER_INDEX",
    "PAD_INDEX",
    "VocabKind",
    "atom_context",
    "bond_context",
    "bond_descriptor",
    "bonds_in_pair_order",
    "contexts",
]
