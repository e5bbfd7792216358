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


# Context strings repeat across molecules (a corpus has millions of atoms but thousands of distinct contexts), so
# each (head, sorted keys) is joined once per process; the cache is dropped when it grows past this many entries.
_JOINED_LIMIT = 200_000
_joined: dict[tuple[str, ...], str] = {}
_descriptors: dict[tuple, str] = {}  # (bond type, stereo, direction) -> bond_descriptor's string
_type_names: dict[Chem.BondType, str] = {}  # str() of a Boost.Python enum costs more than this lookup


def _join_context(head: str, keys: list[str]) -> str:
    # Distinct keys sorted as plain strings, each followed by its count: "C_C-SINGLE1_O-SINGLE1".
    keys.sort()
    cache_key = (head, *keys)
    joined = _joined.get(cache_key)
    if joined is None:
        counts: dict[str, int] = {}
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        joined = head + "".join(f"_{key}{n}" for key, n in counts.items())
        if len(_joined) >= _JOINED_LIMIT:
            _joined.clear()
        _joined[cache_key] = joined
    return joined


def atom_context(mol: Chem.Mol, atom: Chem.Atom) -> str:
    """Context string of ``atom``, e.g. ethanol's CH2 -> ``"C_C-SINGLE1_O-SINGLE1"``."""
    return molecule_contexts(mol)[0][atom.GetIdx()]


def bond_context(mol: Chem.Mol, bond: Chem.Bond) -> str:
    """Context string of ``bond``: its descriptor, then ``"<end symbol>-<descriptor>"`` of every other bond at
    either end (the bond itself excluded; two atoms share at most one bond)."""
    return _bond_contexts(_bond_rows(mol), _symbols(mol))[bond.GetIdx()]


# Whole-molecule passes: every bond's type / descriptor and every atom's symbol is read from RDKit once and shared
# by all the contexts that mention it. Atoms and bonds are fetched by index: iterating mol.GetAtoms() goes through
# RDKit's Python sequence wrapper, which re-counts the atoms at every step and cost more than the contexts.

def _symbols(mol: Chem.Mol) -> list[str]:
    atom = mol.GetAtomWithIdx
    return [atom(i).GetSymbol() for i in range(mol.GetNumAtoms())]


def _bond_rows(mol: Chem.Mol) -> list[tuple[int, int, str, str]]:
    """(begin atom, end atom, bond type name, descriptor) of every bond, RDKit bond index order."""
    rows = []
    for bond in map(mol.GetBondWithIdx, range(mol.GetNumBonds())):
        kind, stereo, direction = bond.GetBondType(), bond.GetStereo(), bond.GetBondDir()
        name = _type_names.get(kind)
        if name is None:
            name = _type_names[kind] = str(kind)
        descriptor = _descriptors.get((kind, stereo, direction))
        if descriptor is None:
            descriptor = _descriptors[(kind, stereo, direction)] = f"({name}-{stereo}-{direction})"
        rows.append((bond.GetBeginAtomIdx(), bond.GetEndAtomIdx(), name, descriptor))
    return rows


def _atom_contexts(bonds: list[tuple[int, int, str, str]], symbols: list[str]) -> list[str]:
    """Contexts of all atoms, in atom index order."""
    keys: list[list[str]] = [[] for _ in symbols]
    for i, j, name, _ in bonds:
        keys[i].append(f"{symbols[j]}-{name}")
        keys[j].append(f"{symbols[i]}-{name}")
    return [_join_context(symbol, k) for symbol, k in zip(symbols, keys)]


def _bond_contexts(bonds: list[tuple[int, int, str, str]], symbols: list[str]) -> list[str]:
    """Contexts of all bonds, in RDKit bond index order."""
    at_atom: list[list[tuple[int, str]]] = [[] for _ in symbols]  # per atom: (bond, "<atom symbol>-<descriptor>")
    for k, (i, j, _, descriptor) in enumerate(bonds):
        at_atom[i].append((k, f"{symbols[i]}-{descriptor}"))
        at_atom[j].append((k, f"{symbols[j]}-{descriptor}"))
    return [_join_context(descriptor, [key for end in (i, j) for other, key in at_atom[end] if other != k])
            for k, (i, j, _, descriptor) in enumerate(bonds)]


def _pair(bond: Chem.Bond) -> tuple[int, int]:
    i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
    return (i, j) if i < j else (j, i)


def bonds_in_pair_order(mol: Chem.Mol) -> list[Chem.Bond]:
    """Chemical bonds ordered by (lower atom index, higher atom index).

    This is the order upstream's MolGraph enumerates bonds in (``for a1: for a2 > a1``), hence the order of bond
    labels and of the directed-edge pairs (2k+1, 2k+2) in a batch; sorting avoids the O(n_atoms²) double loop.
    """
    return sorted(map(mol.GetBondWithIdx, range(mol.GetNumBonds())), key=_pair)


def molecule_contexts(mol: Chem.Mol) -> tuple[list[str], list[str]]:
    """(atom contexts in atom order, bond contexts in pair order): both kinds from one read of the molecule."""
    symbols, bonds = _symbols(mol), _bond_rows(mol)
    by_index = _bond_contexts(bonds, symbols)
    order = sorted(range(len(bonds)), key=lambda k: (min(bonds[k][:2]), max(bonds[k][:2])))
    return _atom_contexts(bonds, symbols), [by_index[k] for k in order]


def contexts(mol: Chem.Mol, kind: VocabKind) -> list[str]:
    """Context strings of every atom (atom order) or every bond (pair order, see :func:`bonds_in_pair_order`)."""
    if kind == "atom":
        return _atom_contexts(_bond_rows(mol), _symbols(mol))
    return molecule_contexts(mol)[1]


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
    "molecule_contexts",
]
