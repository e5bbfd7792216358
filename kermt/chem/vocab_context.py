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
    counts: Counter = Counter()
    for bond in atom.GetBonds():
        neighbour = bond.GetOtherAtom(atom)
        counts[f"{neighbour.GetSymbol()}-{bond.GetBondType()}"] += 1
    return _join_context(atom.GetSymbol(), counts)


def bond_context(mol: Chem.Mol, bond: Chem.Bond) -> str:
    """Context string of ``bond``: its descriptor, then ``"<end symbol>-<descriptor>"`` of every other bond at
    either end (a bond back to the other endpoint, i.e. a ring closure of size 2, cannot exist and is skipped)."""
    ends = (bond.GetBeginAtom(), bond.GetEndAtom())
    end_ids = {atom.GetIdx() for atom in ends}
    counts: Counter = Counter()
    for end in ends:
        for other in end.GetBonds():
            if other.GetOtherAtomIdx(end.GetIdx()) in end_ids:
                continue
            counts[f"{end.GetSymbol()}-{bond_descriptor(other)}"] += 1
    return _join_context(bond_descriptor(bond), counts)


def bonds_in_pair_order(mol: Chem.Mol) -> list[Chem.Bond]:
    """Chemical bonds ordered by (lower atom index, higher atom index).

    This is the order upstream's MolGraph enumerates bonds in (``for a1: for a2 > a1``), hence the order of bond
    labels and of the directed-edge pairs (2k+1, 2k+2) in a batch; sorting avoids the O(n_atoms²) double loop.
    """
    def pair(bond: Chem.Bond) -> tuple[int, int]:
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        return (i, j) if i < j else (j, i)

    return sorted(mol.GetBonds(), key=pair)


def contexts(mol: Chem.Mol, kind: VocabKind) -> list[str]:
    """Context strings of every atom (atom order) or every bond (pair order, see :func:`bonds_in_pair_order`)."""
    if kind == "atom":
        return [atom_context(mol, atom) for atom in mol.GetAtoms()]
    return [bond_context(mol, bond) for bond in bonds_in_pair_order(mol)]


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
