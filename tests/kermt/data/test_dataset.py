"""Batches of a MoleculeSet: vectorised selection, and bond dropout drawn per global batch."""

from __future__ import annotations

import numpy as np

from kermt.chem.molgraph import FlatGraphs
from kermt.data.collate import collate_graphs
from kermt.data.dataset import MoleculeSet, bond_keep_mask, worker_keep_mask
from kermt.data.featurize import featurize_smiles
from kermt.data.sampling import worker_share
from kermt.data.tables import load_molecule_table
from tests.conftest import FIXTURE_DIR


def _fixture_graphs() -> FlatGraphs:
    return featurize_smiles(load_molecule_table(FIXTURE_DIR / "smiles.csv").smiles).graphs


def test_select_equals_the_per_molecule_path():
    flat = _fixture_graphs()
    rows = np.array([7, 0, 21, 7, 3, 25])
    expected = FlatGraphs.from_graphs([flat.graphs()[i] for i in rows])
    got = flat.select(rows)
    for name in ("f_atoms", "bond_atoms", "bond_feats", "bond_rdkit_idx", "atom_counts", "bond_counts"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)


def test_dropped_bonds_disappear_from_the_batch_graph():
    flat = _fixture_graphs()
    rows = np.array([0, 1, 2])
    keep = np.ones(int(flat.bond_counts[rows].sum()), dtype=bool)
    keep[[0, 5]] = False  # molecule 0 loses its first and sixth bond
    full, dropped = collate_graphs(flat.select(rows)), collate_graphs(flat.select(rows, keep))
    assert dropped.f_bonds.shape[0] == full.f_bonds.shape[0] - 4  # two chemical bonds = four directed edges
    assert dropped.f_atoms.shape == full.f_atoms.shape
    assert dropped.b_scope[0, 1] == full.b_scope[0, 1] - 4 and (dropped.b_scope[1:, 1] == full.b_scope[1:, 1]).all()


def test_worker_slices_of_a_global_keep_mask_reassemble_it():
    flat = _fixture_graphs()
    data = MoleculeSet(flat, None, np.zeros((len(flat), 1), np.float32), tuple(str(i) for i in range(len(flat))))
    global_rows = np.array([4, 9, 1, 13, 22, 6, 0])
    keep = bond_keep_mask(global_rows, flat.bond_counts, 0.3, np.random.default_rng(5))
    parts = [worker_keep_mask(global_rows, worker_share(global_rows, r, 3), flat.bond_counts, keep) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate(parts), keep)
    batch = data.batch(worker_share(global_rows, 1, 3), parts[1])
    assert batch.graph.num_molecules == len(worker_share(global_rows, 1, 3))
