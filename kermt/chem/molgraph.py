"""One molecule as a directed graph in upstream KERMT's edge order, plus a flat many-molecule form.

Upstream behaviour: docs/upstream-compatibility.md#featurization.

Each kept chemical bond k joins atoms (a1 < a2), bonds ordered by (a1, a2). It yields two directed edges with
consecutive ids: 2k = a1 -> a2 and 2k+1 = a2 -> a1. So ``b2a`` and ``b2revb`` are implied by the bond list and
are derived, not stored.

``FlatGraphs`` concatenates many molecules' arrays with per-molecule counts: the shape Ray Data / Arrow
columns want, and the input of the vectorised collate in ``kermt.data.collate``. It is the compact store: feature
rows as small integer codes (``kermt.chem.codes``), local indices as uint16, about 0.5 KB for a drug-like molecule
instead of ~15 KB of float rows; the collate expands a batch's rows to the float one-hot rows, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np
from rdkit import Chem

from kermt.chem.codes import ATOM_LAYOUT, BOND_LAYOUT, CodedRows, index_dtype
from kermt.chem.features import ATOM_FDIM, BOND_ONLY_FDIM, AtomTable, BondTable


@dataclass(frozen=True)
class MolGraph:
    """Graph arrays of one molecule; all indices are local (0-based, no padding row).

    f_atoms        float32 [n_atoms, 151]
    bond_atoms     int64   [n_bonds, 2]    kept bonds (a1 < a2) in upstream order
    bond_feats     float32 [n_bonds, 14]   bond-only features of each kept bond
    bond_rdkit_idx int64   [n_bonds]       RDKit bond index of each kept bond
    """

    f_atoms: np.ndarray
    bond_atoms: np.ndarray
    bond_feats: np.ndarray
    bond_rdkit_idx: np.ndarray

    @classmethod
    def empty(cls) -> "MolGraph":
        """The record of an invalid row: no atoms, no bonds."""
        return cls(
            f_atoms=np.zeros((0, ATOM_FDIM), dtype=np.float32),
            bond_atoms=np.zeros((0, 2), dtype=np.int64),
            bond_feats=np.zeros((0, BOND_ONLY_FDIM), dtype=np.float32),
            bond_rdkit_idx=np.zeros(0, dtype=np.int64),
        )

    @property
    def n_atoms(self) -> int:
        return int(self.f_atoms.shape[0])

    @property
    def n_bonds(self) -> int:
        """Number of directed edges (twice the kept chemical bonds), as upstream's ``MolGraph.n_bonds``."""
        return 2 * int(self.bond_atoms.shape[0])

    @property
    def b2a(self) -> np.ndarray:
        """Source atom of each directed edge: int64 [n_bonds]."""
        return self.bond_atoms.reshape(-1)

    @property
    def b2revb(self) -> np.ndarray:
        """Reverse edge of each directed edge (2k <-> 2k+1): int64 [n_bonds]."""
        return np.arange(self.n_bonds, dtype=np.int64) ^ 1

    @property
    def rdkit_bond_idx(self) -> np.ndarray:
        """RDKit bond index of each directed edge: int64 [n_bonds]."""
        return np.repeat(self.bond_rdkit_idx, 2)

    @property
    def f_bonds(self) -> np.ndarray:
        """concat(source atom features, bond features) per directed edge: float32 [n_bonds, 165]."""
        return np.concatenate([self.f_atoms[self.b2a], np.repeat(self.bond_feats, 2, axis=0)], axis=1)

    @property
    def a2b(self) -> np.ndarray:
        """Incoming edge ids of each atom, ascending, padded with -1: int64 [n_atoms, max(in-degree)]."""
        targets = self.bond_atoms[:, ::-1].reshape(-1)
        return grouped_positions(targets, self.n_atoms, fill=-1, min_width=0)


def mol_to_graph(
    mol: Chem.Mol, bond_drop_rate: float = 0.0, rng: np.random.Generator | None = None
) -> MolGraph:
    """Featurise one molecule (atoms in RDKit order, no hydrogens added). See :func:`build_graphs`."""
    flat, errors = build_graphs([mol], bond_drop_rate, rng)
    if errors[0] is not None:
        raise ValueError(errors[0])
    return flat.graphs()[0]


def build_graphs(
    mols: Sequence[Chem.Mol | None], bond_drop_rate: float = 0.0, rng: np.random.Generator | None = None
) -> tuple["FlatGraphs", list[str | None]]:
    """Featurise many molecules at once (the fast path: numpy work once per batch, not per molecule).

    Returns (graphs with one entry per input, error per input). A None input, or a molecule upstream cannot
    featurise (its error says why, e.g. an out-of-range formal charge), gets an empty graph.

    Bond dropout: with ``bond_drop_rate > 0`` each chemical bond is dropped (both directions) with that
    probability: one Bernoulli draw per bond, molecule after molecule, each in edge order, exactly the
    sequence of upstream's per-bond ``np.random.binomial`` calls. ``rng`` None draws from numpy's global RNG
    as upstream does (so ``np.random.seed(s)`` reproduces upstream's choices); pass a
    ``np.random.Generator`` for reproducibility that does not depend on global state.
    """
    atoms, bonds = AtomTable(), BondTable()
    atom_counts, errors = [], []
    for mol in mols:
        before, error = atoms.n_atoms, None
        if mol is not None:
            try:
                atoms.add(mol)
            except ValueError as err:
                error, mol = str(err), None
        bonds.add(mol)
        atom_counts.append(atoms.n_atoms - before)
        errors.append(error)
    pairs, rdkit_idx, feats, molecule = bonds.encode()
    if bond_drop_rate > 0 and len(pairs):
        draws = (rng.binomial if rng is not None else np.random.binomial)(1, bond_drop_rate, size=len(pairs))
        keep = draws == 0
        pairs, rdkit_idx, feats, molecule = pairs[keep], rdkit_idx[keep], feats[keep], molecule[keep]
    flat = FlatGraphs.from_dense(
        f_atoms=atoms.encode(),
        bond_atoms=pairs,
        bond_feats=feats,
        bond_rdkit_idx=rdkit_idx,
        atom_counts=np.array(atom_counts, dtype=np.int64),
        bond_counts=np.bincount(molecule, minlength=len(mols)).astype(np.int64),
    )
    return flat, errors


def grouped_positions(group_of: np.ndarray, n_groups: int, fill: int, min_width: int) -> np.ndarray:
    """Row g lists, ascending, the positions i with ``group_of[i] == g``; padded with ``fill``.

    Returns int64 [n_groups, max(max group size, min_width)]. Vectorised: stable sort + rank within group.
    """
    counts = np.bincount(group_of, minlength=n_groups)
    width = max(int(counts.max(initial=0)), min_width)
    out = np.full((n_groups, width), fill, dtype=np.int64)
    order = np.argsort(group_of, kind="stable")
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(order)) - np.repeat(starts, counts)
    out[group_of[order], rank] = order
    return out


@dataclass(frozen=True)
class FlatGraphs:
    """Many molecules' graphs in the compact store; molecule i owns ``atom_counts[i]`` atom rows and
    ``bond_counts[i]`` chemical bond rows (half its directed edges), concatenated in molecule order.

    atoms           CodedRows [sum atoms] of ATOM_LAYOUT (13 bytes a row instead of 151 float32)
    bond_atoms      uint16 (int32 when a molecule has > 65,536 atoms or bonds) [sum bonds, 2]: local ids, a1 < a2
    bonds           CodedRows [sum bonds] of BOND_LAYOUT (3 bytes a row instead of 14 float32)
    bond_rdkit_idx  same dtype as bond_atoms [sum bonds]: RDKit bond index of each kept bond
    atom_counts, bond_counts  int32 [n_mols]

    ``f_atoms`` / ``bond_feats`` expand to the dense float32 rows of upstream's layout, exactly (the collate does
    this per batch).
    """

    atoms: CodedRows
    bond_atoms: np.ndarray
    bonds: CodedRows
    bond_rdkit_idx: np.ndarray
    atom_counts: np.ndarray
    bond_counts: np.ndarray

    def __len__(self) -> int:
        return int(self.atom_counts.shape[0])

    @property
    def f_atoms(self) -> np.ndarray:
        """float32 [sum atoms, 151], expanded: meant for batches, not for a whole data set."""
        return ATOM_LAYOUT.expand(self.atoms)

    @property
    def bond_feats(self) -> np.ndarray:
        """float32 [sum bonds, 14], expanded."""
        return BOND_LAYOUT.expand(self.bonds)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (what a molecule costs in memory and in the object store)."""
        arrays = (self.bond_atoms, self.bond_rdkit_idx, self.atom_counts, self.bond_counts)
        return self.atoms.nbytes + self.bonds.nbytes + sum(a.nbytes for a in arrays)

    @classmethod
    def from_dense(cls, f_atoms: np.ndarray, bond_atoms: np.ndarray, bond_feats: np.ndarray,
                   bond_rdkit_idx: np.ndarray, atom_counts: np.ndarray, bond_counts: np.ndarray) -> "FlatGraphs":
        """The store of float rows (ValueError if a row is not exactly representable, see kermt.chem.codes)."""
        index = index_dtype(int(max(np.max(atom_counts, initial=0), np.max(bond_counts, initial=0))))
        return cls(
            atoms=ATOM_LAYOUT.encode(f_atoms),
            bond_atoms=np.asarray(bond_atoms).reshape(-1, 2).astype(index),
            bonds=BOND_LAYOUT.encode(bond_feats),
            bond_rdkit_idx=np.asarray(bond_rdkit_idx).astype(index),
            atom_counts=np.asarray(atom_counts).astype(np.int32),
            bond_counts=np.asarray(bond_counts).astype(np.int32),
        )

    @classmethod
    def from_graphs(cls, graphs: Sequence[MolGraph]) -> "FlatGraphs":
        return cls.from_dense(
            f_atoms=_concat([g.f_atoms for g in graphs], (0, ATOM_FDIM), np.float32),
            bond_atoms=_concat([g.bond_atoms for g in graphs], (0, 2), np.int64),
            bond_feats=_concat([g.bond_feats for g in graphs], (0, BOND_ONLY_FDIM), np.float32),
            bond_rdkit_idx=_concat([g.bond_rdkit_idx for g in graphs], (0,), np.int64),
            atom_counts=np.array([g.n_atoms for g in graphs], dtype=np.int64),
            bond_counts=np.array([len(g.bond_atoms) for g in graphs], dtype=np.int64),
        )

    def graphs(self) -> list[MolGraph]:
        """Split back into per-molecule records in the dense form of MolGraph (float rows, int64 indices)."""
        atom_splits = np.cumsum(self.atom_counts)[:-1]
        bond_splits = np.cumsum(self.bond_counts)[:-1]
        dense = (self.bond_atoms.astype(np.int64), self.bond_feats, self.bond_rdkit_idx.astype(np.int64))
        parts = [np.split(a, bond_splits) for a in dense]
        return [MolGraph(f, *bonds) for f, *bonds in zip(np.split(self.f_atoms, atom_splits), *parts)]

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat numpy arrays by name (see RAGGED for which count each row array follows)."""
        return {"atom_codes": self.atoms.codes, "atom_flags": self.atoms.flags, "atom_values": self.atoms.values,
                "bond_atoms": self.bond_atoms, "bond_codes": self.bonds.codes, "bond_flags": self.bonds.flags,
                "bond_rdkit_idx": self.bond_rdkit_idx, "atom_counts": self.atom_counts,
                "bond_counts": self.bond_counts}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "FlatGraphs":
        """Inverse of :meth:`to_arrays`; row arrays may come flattened (e.g. from Arrow list columns)."""
        a = {name: np.asarray(arrays[name]) for name in RAGGED_WIDTH}
        a = {name: v.reshape(-1, width) if width else v.reshape(-1) for (name, width), v in zip(RAGGED_WIDTH.items(),
                                                                                                a.values())}
        no_values = np.zeros((len(a["bond_flags"]), 0), np.float32)  # bond rows have no real-valued column
        return cls(
            atoms=CodedRows(a["atom_codes"], a["atom_flags"], a["atom_values"]),
            bond_atoms=a["bond_atoms"],
            bonds=CodedRows(a["bond_codes"], a["bond_flags"], no_values),
            bond_rdkit_idx=a["bond_rdkit_idx"],
            atom_counts=np.asarray(arrays["atom_counts"]).astype(np.int32, copy=False),
            bond_counts=np.asarray(arrays["bond_counts"]).astype(np.int32, copy=False),
        )

    def select(self, rows: np.ndarray, keep_bond: np.ndarray | None = None) -> "FlatGraphs":
        """The molecules at ``rows`` (in that order), as a new FlatGraphs; a vectorised gather.

        ``keep_bond`` (bool per chemical bond of the selected molecules, in order) drops bonds: bond dropout.
        """
        rows = np.asarray(rows, dtype=np.int64)
        atom_idx = _gather_ranges(self._atom_offsets[rows], self.atom_counts[rows])
        bond_counts = self.bond_counts[rows]
        bond_idx = _gather_ranges(self._bond_offsets[rows], bond_counts)
        if keep_bond is not None:
            bond_idx = bond_idx[keep_bond]
            owner = np.repeat(np.arange(len(rows)), bond_counts)[keep_bond]
            bond_counts = np.bincount(owner, minlength=len(rows)).astype(np.int32)
        return FlatGraphs(
            atoms=self.atoms.take(atom_idx),
            bond_atoms=self.bond_atoms[bond_idx],
            bonds=self.bonds.take(bond_idx),
            bond_rdkit_idx=self.bond_rdkit_idx[bond_idx],
            atom_counts=self.atom_counts[rows],
            bond_counts=bond_counts,
        )

    def max_in_degrees(self) -> np.ndarray:
        """int64 [n]: each molecule's largest atom degree (0 for a molecule without bonds). With upstream's padding
        a batch's neighbour tables are as wide as its largest degree, and that width enters every neighbour sum."""
        atom_starts = self._atom_offsets
        owner = np.repeat(np.arange(len(self)), self.bond_counts)
        ends = self.bond_atoms.astype(np.int64) + atom_starts[owner][:, None]
        degree = np.bincount(ends.reshape(-1), minlength=int(atom_starts[-1]))
        out = np.zeros(len(self), dtype=np.int64)
        np.maximum.at(out, np.repeat(np.arange(len(self)), self.atom_counts), degree)
        return out

    # Offsets are computed once per store, not per batch: a cumsum over 1M molecules per batch costs more than
    # the batch's collate.
    @cached_property
    def _atom_offsets(self) -> np.ndarray:
        return _offsets(self.atom_counts)

    @cached_property
    def _bond_offsets(self) -> np.ndarray:
        return _offsets(self.bond_counts)


# Row arrays of FlatGraphs.to_arrays with the width of one row (0: a 1-d array); atom_* rows follow atom_counts,
# bond_* rows follow bond_counts.
RAGGED_WIDTH = {"atom_codes": len(ATOM_LAYOUT.blocks), "atom_flags": 0, "atom_values": len(ATOM_LAYOUT.value_columns),
                "bond_atoms": 2, "bond_codes": len(BOND_LAYOUT.blocks), "bond_flags": 0, "bond_rdkit_idx": 0}


def _offsets(counts: np.ndarray) -> np.ndarray:
    """[len + 1] start offsets of consecutive blocks of the given sizes."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _gather_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``range(s, s + c)`` for every (s, c), vectorised."""
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(_offsets(counts)[:-1], counts)
    return np.repeat(starts, counts) + within


def _concat(arrays: list[np.ndarray], empty_shape: tuple[int, ...], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(empty_shape, dtype=dtype)


__all__ = ["RAGGED_WIDTH", "FlatGraphs", "MolGraph", "build_graphs", "grouped_positions", "mol_to_graph"]
