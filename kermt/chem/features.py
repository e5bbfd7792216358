"""Atom (151) and bond (14) feature vectors in upstream KERMT's exact layout (spec §3.1, §3.2).

Features are built per molecule with numpy: RDKit is asked once per atom/bond for a small tuple of integer
properties, then every one-hot block is written with one fancy-index assignment. This is what makes
featurisation several times faster than building Python lists per atom, while giving the same bits.

Atom layout (offset: block):
    0 atomic number (Z-1 in 0..99, +unk) | 101 total degree 0..5 (+unk) | 108 formal charge (6 slots, quirk below)
    114 chiral tag 0..3 (+unk) | 119 total Hs 0..4 (+unk) | 125 hybridisation SP..SP3D2 (+unk) | 131 aromatic
    132 mass/100 | 133 implicit valence 0..6 (+unk) | 141 H-acceptor | 142 H-donor | 143 acidic | 144 basic
    145 in ring of size 3, 4, 5, 6, 7, 8
Bond layout: [0 (not-null flag), single, double, triple, aromatic, conjugated, in ring] + stereo 0..5 (+unk).
"""

from __future__ import annotations

import numpy as np
from rdkit import Chem

ATOM_FDIM = 151
BOND_ONLY_FDIM = 14
BOND_FDIM = ATOM_FDIM + BOND_ONLY_FDIM  # a directed edge carries its source atom's features

_OFF_Z, _OFF_DEGREE, _OFF_CHARGE, _OFF_CHIRAL, _OFF_HS, _OFF_HYBRID = 0, 101, 108, 114, 119, 125
_OFF_AROMATIC, _OFF_MASS, _OFF_VALENCE, _OFF_SMARTS, _OFF_RING = 131, 132, 133, 141, 145
_RING_SIZES = (3, 4, 5, 6, 7, 8)

# RDKit HybridizationType value -> slot; everything else (S, SP2D, OTHER, UNSPECIFIED) is "unknown" (5).
_HYBRID_SLOT = np.full(64, 5, dtype=np.int64)
for _slot, _hyb in enumerate(("SP", "SP2", "SP3", "SP3D", "SP3D2")):
    _HYBRID_SLOT[int(getattr(Chem.rdchem.HybridizationType, _hyb))] = _slot

# Facts from upstream (kermt/data/molgraph.py, inherited from GROVER). Order in the feature vector is
# acceptor, donor, acidic, basic.
_ACCEPTOR_SMARTS = (
    "[$([O,S;H1;v2;!$(*-*=[O,N,P,S])]),$([O,S;H0;v2]),$([O,S;-]),$([N;v3;!$(N-*=[O,N,P,S])]),"
    "n&H0&+0,$([o,s;+0;!$([o,s]:n);!$([o,s]:c:n)])]"
)
_DONOR_SMARTS = "[$([N;!H0;v3,v4&+1]),$([O,S;H1;+0]),n&H1&+0]"
_ACIDIC_SMARTS = "[$([C,S](=[O,S,P])-[O;H1,-1])]"
_BASIC_SMARTS = (
    "[#7;+,$([N;H2&+0][$([C,a]);!$([C,a](=O))]),$([N;H1&+0]([$([C,a]);!$([C,a](=O))])[$([C,a]);"
    "!$([C,a](=O))]),$([N;H0&+0]([C;!$(C(=O))])([C;!$(C(=O))])[C;!$(C(=O))])]"
)
_PATTERNS = tuple(Chem.MolFromSmarts(s) for s in (_ACCEPTOR_SMARTS, _DONOR_SMARTS, _ACIDIC_SMARTS, _BASIC_SMARTS))

_BOND_TYPE_SLOT = {
    Chem.rdchem.BondType.SINGLE: 1,
    Chem.rdchem.BondType.DOUBLE: 2,
    Chem.rdchem.BondType.TRIPLE: 3,
    Chem.rdchem.BondType.AROMATIC: 4,
}
_IMPLICIT = Chem.ValenceType.IMPLICIT


def _one_hot_or_unknown(out: np.ndarray, rows: np.ndarray, values: np.ndarray, offset: int, n_choices: int) -> None:
    """Set ``out[i, offset + v]`` for v in ``0..n_choices-1``, else the trailing unknown slot."""
    slot = np.where((values >= 0) & (values < n_choices), values, n_choices)
    out[rows, offset + slot] = 1.0


def formal_charge_slot(charge: np.ndarray, atom_desc: list[str] | None = None) -> np.ndarray:
    """Upstream's formal-charge slot: the charge is used as a Python list index into 6 slots.

    0->0, +1->1, +2->2, +3/-3->3, +4/-2->4, +5/-1->5. Upstream raises IndexError for charge >= +6 or <= -7;
    here that is a ValueError naming the atom (``atom_desc[i]`` describes atom ``i`` when given).
    """
    bad = np.flatnonzero((charge >= 6) | (charge <= -7))
    if bad.size:
        i = int(bad[0])
        who = atom_desc[i] if atom_desc else f"atom {i}"
        raise ValueError(
            f"formal charge {int(charge[i]):+d} on {who} cannot be featurised: upstream KERMT's 6-slot charge "
            "block only accepts charges -6..+5"
        )
    return np.mod(charge, 6)


def atom_features(mol: Chem.Mol) -> np.ndarray:
    """Atom feature matrix of ``mol``, atoms in RDKit order: float32 [n_atoms, 151]."""
    n = mol.GetNumAtoms()
    props = np.array(
        [
            (a.GetAtomicNum(), a.GetTotalDegree(), a.GetFormalCharge(), int(a.GetChiralTag()), a.GetTotalNumHs(),
             int(a.GetHybridization()), a.GetIsAromatic(), a.GetValence(_IMPLICIT))
            for a in mol.GetAtoms()
        ],
        dtype=np.int64,
    ).reshape(n, 8)
    out = np.zeros((n, ATOM_FDIM), dtype=np.float32)
    if n == 0:
        return out
    rows = np.arange(n)
    z, degree, charge, chiral, num_hs, hybrid, aromatic, valence = props.T
    _one_hot_or_unknown(out, rows, z - 1, _OFF_Z, 100)
    _one_hot_or_unknown(out, rows, degree, _OFF_DEGREE, 6)
    out[rows, _OFF_CHARGE + formal_charge_slot(charge, _atom_descriptions(mol, charge))] = 1.0
    _one_hot_or_unknown(out, rows, chiral, _OFF_CHIRAL, 4)
    _one_hot_or_unknown(out, rows, num_hs, _OFF_HS, 5)
    out[rows, _OFF_HYBRID + _HYBRID_SLOT[np.clip(hybrid, 0, _HYBRID_SLOT.size - 1)]] = 1.0
    out[:, _OFF_AROMATIC] = aromatic
    # Mass is divided in float64 like upstream's Python float, then stored as float32.
    out[:, _OFF_MASS] = np.array([a.GetMass() for a in mol.GetAtoms()], dtype=np.float64) / 100
    _one_hot_or_unknown(out, rows, valence, _OFF_VALENCE, 7)
    for column, pattern in enumerate(_PATTERNS):
        # Same call and defaults as upstream (maxMatches=1000), so huge molecules truncate identically.
        matched = [i for match in mol.GetSubstructMatches(pattern) for i in match]
        out[matched, _OFF_SMARTS + column] = 1.0
    _ring_size_flags(out, mol)
    return out


def _atom_descriptions(mol: Chem.Mol, charge: np.ndarray) -> list[str] | None:
    """Human-readable atom names, only built when some charge is out of range (the error path)."""
    if not ((charge >= 6) | (charge <= -7)).any():
        return None
    smiles = Chem.MolToSmiles(mol)
    return [f"atom {a.GetIdx()} ({a.GetSymbol()}) of {smiles!r}" for a in mol.GetAtoms()]


def _ring_size_flags(out: np.ndarray, mol: Chem.Mol) -> None:
    """Columns 145..150: atom lies in a ring of size 3..8 of RDKit's ring perception (as IsAtomInRingOfSize)."""
    for ring in mol.GetRingInfo().AtomRings():
        if 3 <= len(ring) <= 8:
            out[list(ring), _OFF_RING + len(ring) - 3] = 1.0


def sorted_bonds(mol: Chem.Mol) -> tuple[np.ndarray, np.ndarray]:
    """Bonds in upstream's enumeration order: pairs (a1 < a2) sorted lexicographically.

    Returns (pairs int64 [n_bonds, 2] with a1 < a2, rdkit_idx int64 [n_bonds]). Sorting replaces upstream's
    O(n_atoms^2) GetBondBetweenAtoms scan with the same order.
    """
    raw = np.array([(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()], dtype=np.int64)
    raw = raw.reshape(-1, 2)
    pairs = np.sort(raw, axis=1)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    return pairs[order], order.astype(np.int64)


def bond_features(mol: Chem.Mol, rdkit_idx: np.ndarray) -> np.ndarray:
    """Bond feature rows for the RDKit bonds ``rdkit_idx``: float32 [len(rdkit_idx), 14]."""
    props = np.array(
        [
            (_BOND_TYPE_SLOT.get(b.GetBondType(), 0), b.GetIsConjugated(), b.IsInRing(), int(b.GetStereo()))
            for b in mol.GetBonds()
        ],
        dtype=np.int64,
    ).reshape(-1, 4)[rdkit_idx]
    n = len(rdkit_idx)
    out = np.zeros((n, BOND_ONLY_FDIM), dtype=np.float32)
    rows = np.arange(n)
    has_type = props[:, 0] > 0
    out[rows[has_type], props[has_type, 0]] = 1.0  # column 0 (null-bond flag) stays 0 for real bonds
    out[:, 5] = props[:, 1]
    out[:, 6] = props[:, 2]
    _one_hot_or_unknown(out, rows, props[:, 3], 7, 6)
    return out


__all__ = ["ATOM_FDIM", "BOND_FDIM", "BOND_ONLY_FDIM", "atom_features", "bond_features", "formal_charge_slot",
           "sorted_bonds"]
