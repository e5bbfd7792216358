"""The compact store (coded rows, uint16 local ids, int32 counts) collates to exactly today's batches.

The reference is built without the store: dense float rows straight from the featuriser (``atom_features``,
``BondTable``), one MolGraph per molecule, collated by an upstream-style Python loop (upstream's BatchMolGraph).
Every batch field must be torch.equal with the same dtype, for the upstream fixture molecules, 300 drug-like
molecules of the sample set and molecules that reach every corner of the layout (isotopes, charges, stereo,
unknown slots, big rings, ions).
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from rdkit import Chem

from kermt.chem.codes import ATOM_LAYOUT, BOND_LAYOUT, index_dtype
from kermt.chem.features import ATOM_FDIM, BOND_FDIM, BondTable, atom_features
from kermt.chem.molgraph import MolGraph
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from kermt.data.tables import load_molecule_table
from tests.conftest import DATA_DIR, FIXTURE_DIR

SAMPLE = DATA_DIR.parent.parent / "data/sample/admet_demo.csv"
CORNERS = [
    "[13CH3]O", "[2H]C([2H])([2H])Cl", "[NH4+]", "OC(=O)[O-]", "C[S+](C)C", "C[C@H](N)C(=O)O", "F/C=C/F",
    "C/C=C\\C", "[Na+].[Cl-]", "*C", "C1CCCCCCCCC1", "c1ccc2ccccc2c1", "C#N", "[Fe+3]", "B(F)(F)F", "[Se]", "[Xe]",
    "[U]", "[Lr]", "[SiH4]", "P(=O)(O)(O)O", "C[N+](=O)[O-]", "[Fe-2]", "C1CC1C2CCC2", "O=S(=O)(O)c1ccccc1",
    "C[C@@]12CC[C@H]3[C@@H](CC=C4C[C@@H](O)CC[C@@]43C)[C@@H]1CC[C@@H]2O", "[CH2]", "[C]", "N=[N+]=[N-]",
]


def _smiles() -> list[str]:
    fixture = load_molecule_table(FIXTURE_DIR / "smiles.csv").smiles
    with open(SAMPLE) as f:
        sample = [row[0] for row in list(csv.reader(f))[1:301]]
    return list(fixture) + sample + CORNERS


def _dense_graph(smiles: str) -> MolGraph:
    """Today's dense representation of one molecule, straight from the featuriser (no store involved)."""
    mol = Chem.MolFromSmiles(smiles)
    bonds = BondTable()
    bonds.add(mol)
    pairs, rdkit_idx, feats, _ = bonds.encode()
    return MolGraph(atom_features(mol), pairs, feats, rdkit_idx)


def _reference_batch(graphs: list[MolGraph]) -> dict[str, torch.Tensor]:
    """Upstream's BatchMolGraph construction, molecule by molecule (row 0 = padding, a2b = incoming edges)."""
    f_atoms, f_bonds = [np.zeros((1, ATOM_FDIM), np.float32)], [np.zeros((1, BOND_FDIM), np.float32)]
    a2b, b2a, b2revb, a_scope, b_scope = [[]], [0], [0], [], []
    n_atoms = n_bonds = 1
    for g in graphs:
        f_atoms.append(g.f_atoms)
        f_bonds.append(g.f_bonds)
        a2b.extend([] for _ in range(g.n_atoms))
        for source, reverse in zip(g.b2a, g.b2revb):
            b2a.append(n_atoms + int(source))
            b2revb.append(n_bonds + int(reverse))
        for edge in range(g.n_bonds):
            a2b[b2a[n_bonds + (edge ^ 1)]].append(n_bonds + edge)  # the target of an edge is its reverse's source
        a_scope.append((n_atoms, g.n_atoms))
        b_scope.append((n_bonds, g.n_bonds))
        n_atoms, n_bonds = n_atoms + g.n_atoms, n_bonds + g.n_bonds
    width = max(1, max(len(edges) for edges in a2b))
    a2b_array = np.array([edges + [0] * (width - len(edges)) for edges in a2b], dtype=np.int64)
    b2a_array = np.array(b2a, dtype=np.int64)
    arrays = {"f_atoms": np.concatenate(f_atoms), "f_bonds": np.concatenate(f_bonds), "a2b": a2b_array,
              "b2a": b2a_array, "b2revb": np.array(b2revb, dtype=np.int64),
              "a_scope": np.array(a_scope, dtype=np.int64).reshape(-1, 2),
              "b_scope": np.array(b_scope, dtype=np.int64).reshape(-1, 2), "a2a": b2a_array[a2b_array]}
    return {name: torch.from_numpy(value) for name, value in arrays.items()}


def _drop(graph: MolGraph, keep: np.ndarray) -> MolGraph:
    return MolGraph(graph.f_atoms, graph.bond_atoms[keep], graph.bond_feats[keep], graph.bond_rdkit_idx[keep])


def _assert_same_batch(got, expected: dict[str, torch.Tensor]) -> None:
    for name, want in expected.items():
        value = getattr(got, name)
        assert value.dtype == want.dtype and torch.equal(value, want), name


SMILES = _smiles()


@pytest.fixture(scope="module")
def molecule_set() -> MoleculeSet:
    done = featurize_smiles(SMILES)
    assert all(r is None for r in done.reasons), [r for r in done.reasons if r]
    return MoleculeSet(done.graphs, None, np.zeros((len(SMILES), 1), np.float32), done.smiles)


@pytest.fixture(scope="module")
def dense() -> list[MolGraph]:
    return [_dense_graph(s) for s in SMILES]


@pytest.mark.parametrize("seed", range(6))
def test_batches_from_the_store_equal_todays_batches(molecule_set, dense, seed):
    rng = np.random.default_rng(seed)
    rows = rng.permutation(len(SMILES))[: 1 + seed * 20] if seed < 5 else np.arange(len(SMILES))
    _assert_same_batch(molecule_set.batch(rows).graph, _reference_batch([dense[i] for i in rows]))


def test_batches_with_bond_dropout_equal_todays(molecule_set, dense):
    rows = np.random.default_rng(11).permutation(len(SMILES))[:64]
    keep = np.random.default_rng(12).random(int(molecule_set.bond_counts(rows).sum())) >= 0.3
    parts = np.split(keep, np.cumsum(molecule_set.bond_counts(rows))[:-1])
    expected = _reference_batch([_drop(dense[i], k) for i, k in zip(rows, parts)])
    _assert_same_batch(molecule_set.batch(rows, keep).graph, expected)


def test_graph_part_is_under_a_kilobyte_per_molecule(molecule_set):
    graphs = molecule_set.graphs
    assert (graphs.bond_atoms.dtype, graphs.atom_counts.dtype, graphs.atoms.codes.dtype) == (
        np.uint16, np.int32, np.uint8)
    per_molecule = graphs.nbytes / len(graphs)
    dense_bytes = graphs.f_atoms.nbytes + graphs.bond_feats.nbytes + 8 * (3 * len(graphs.bond_atoms) + 2 * len(graphs))
    assert per_molecule <= 1024 and dense_bytes / per_molecule > 20


def test_rows_the_layout_cannot_hold_exactly_are_refused():
    rows = atom_features(Chem.MolFromSmiles("CCO"))
    ATOM_LAYOUT.encode(rows)  # featuriser rows are fine
    for column, value in ((3, 0.5), (7, 1.0), (131, 2.0), (0, -0.0)):
        bad = rows.copy()
        bad[0, column] = value  # a fraction, a second one in the Z block, a flag of 2, a negative zero
        with pytest.raises(ValueError, match="cannot store them exactly"):
            ATOM_LAYOUT.encode(bad)
    null_flag = np.zeros((1, 14), np.float32)
    null_flag[0, 0] = 1.0  # upstream's null-bond flag is a layout column too, kept if it is ever set
    np.testing.assert_array_equal(BOND_LAYOUT.expand(BOND_LAYOUT.encode(null_flag)), null_flag)


def test_local_ids_widen_only_for_giant_molecules():
    assert index_dtype(65_536) == np.uint16 and index_dtype(65_537) == np.int32
