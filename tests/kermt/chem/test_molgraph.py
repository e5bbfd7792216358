"""MolGraph parity with upstream's per-molecule arrays (graph.npz molNN_*), charge quirk, bond dropout."""

from __future__ import annotations

import numpy as np
import pytest
from rdkit import Chem

from kermt.chem.features import ATOM_FDIM, BOND_FDIM, atom_features, formal_charge_slot
from kermt.chem.molgraph import FlatGraphs, build_graphs, mol_to_graph
from tests.conftest import FIXTURE_DIR

GRAPH = np.load(FIXTURE_DIR / "graph.npz", allow_pickle=False)
SMILES = [str(s) for s in GRAPH["smiles"]]
CHARGE_BLOCK = slice(108, 114)


def test_feature_widths_match_upstream():
    assert (ATOM_FDIM, BOND_FDIM) == (int(GRAPH["atom_fdim"]), int(GRAPH["bond_fdim_total"]))


@pytest.mark.parametrize("index", range(len(SMILES)))
@pytest.mark.parametrize("name", ["f_atoms", "f_bonds", "a2b", "b2a", "b2revb", "rdkit_bond_idx"])
def test_each_molecule_reproduces_upstream_exactly(index, name):
    graph = mol_to_graph(Chem.MolFromSmiles(SMILES[index]))
    expected = GRAPH[f"mol{index:02d}_{name}"]
    got = getattr(graph, name)
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "charge, slot", [(0, 0), (1, 1), (2, 2), (3, 3), (-3, 3), (4, 4), (-2, 4), (5, 5), (-1, 5), (-6, 0)]
)
def test_formal_charge_is_used_as_a_list_index(charge, slot):
    atoms = atom_features(Chem.MolFromSmiles(f"[Fe{charge:+d}]"))
    assert atoms[0, CHARGE_BLOCK].tolist() == [1.0 if i == slot else 0.0 for i in range(6)]


@pytest.mark.parametrize("charge", [6, 7, -7])
def test_formal_charge_out_of_upstream_range_names_the_atom(charge):
    mol = Chem.MolFromSmiles(f"CC[Fe{charge:+d}]")
    with pytest.raises(ValueError, match=r"formal charge [+-]\d+ on atom 2 \(Fe\) of "):
        atom_features(mol)
    with pytest.raises(ValueError, match="atom 0"):
        formal_charge_slot(np.array([charge]))


def _upstream_style_kept_pairs(mol: Chem.Mol, rate: float) -> list[tuple[int, int]]:
    """Upstream's loop: pairs a1 < a2 in order, one global-RNG binomial draw per existing bond."""
    kept = []
    n = mol.GetNumAtoms()
    for a1 in range(n):
        for a2 in range(a1 + 1, n):
            if mol.GetBondBetweenAtoms(a1, a2) is not None and not np.random.binomial(1, rate):
                kept.append((a1, a2))
    return kept


def test_bond_drop_with_global_rng_matches_upstream_draws():
    mols = [Chem.MolFromSmiles(s) for s in SMILES]
    np.random.seed(7)
    expected = [_upstream_style_kept_pairs(m, 0.3) for m in mols]
    np.random.seed(7)
    one_by_one = [mol_to_graph(m, bond_drop_rate=0.3) for m in mols]
    np.random.seed(7)
    batched, errors = build_graphs(mols, bond_drop_rate=0.3)
    assert errors == [None] * len(mols)
    for graphs in (one_by_one, batched.graphs()):
        assert [list(map(tuple, g.bond_atoms.tolist())) for g in graphs] == expected
    assert sum(len(e) for e in expected) < sum(m.GetNumBonds() for m in mols)  # something was dropped


def test_batched_build_equals_one_by_one_and_isolates_bad_molecules():
    mols = [Chem.MolFromSmiles(s) for s in SMILES[:5]]
    mols.insert(2, Chem.MolFromSmiles("CC[Fe+7]"))
    mols.insert(4, None)
    flat, errors = build_graphs(mols)
    assert [e is None for e in errors] == [True, True, False, True, True, True, True]
    assert "formal charge +7 on atom 2 (Fe)" in errors[2]
    graphs = flat.graphs()
    assert graphs[2].n_atoms == graphs[4].n_atoms == 0
    for index in (0, 1, 3, 5, 6):
        reference = mol_to_graph(mols[index])
        np.testing.assert_array_equal(graphs[index].f_bonds, reference.f_bonds)
        np.testing.assert_array_equal(graphs[index].a2b, reference.a2b)


def test_bond_drop_with_generator_is_reproducible_and_drops_both_directions():
    mol = Chem.MolFromSmiles(SMILES[8])
    first = mol_to_graph(mol, 0.5, np.random.default_rng(3))
    second = mol_to_graph(mol, 0.5, np.random.default_rng(3))
    full = mol_to_graph(mol)
    np.testing.assert_array_equal(first.bond_atoms, second.bond_atoms)
    assert 0 < len(first.bond_atoms) < len(full.bond_atoms)
    # kept edges come in reverse pairs whose features are the kept bonds' features
    np.testing.assert_array_equal(first.b2a.reshape(-1, 2), first.bond_atoms)
    rdkit_rows = {int(i): row for i, row in zip(full.bond_rdkit_idx, full.bond_feats)}
    for idx, row in zip(first.bond_rdkit_idx, first.bond_feats):
        np.testing.assert_array_equal(row, rdkit_rows[int(idx)])


def test_flat_graphs_round_trip():
    graphs = [mol_to_graph(Chem.MolFromSmiles(s)) for s in SMILES]
    back = FlatGraphs.from_graphs(graphs).graphs()
    assert len(back) == len(graphs)
    for a, b in zip(graphs, back):
        np.testing.assert_array_equal(a.f_bonds, b.f_bonds)
        np.testing.assert_array_equal(a.a2b, b.a2b)
