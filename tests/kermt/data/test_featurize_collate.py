"""Vectorised collate reproduces upstream's whole-batch graph (graph.npz batch_*) exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rdkit import Chem

from kermt.chem.molgraph import FlatGraphs, mol_to_graph
from kermt.data.batch import BatchMolGraph
from kermt.data.collate import collate_arrays, collate_graphs
from tests.conftest import FIXTURE_DIR

GRAPH = np.load(FIXTURE_DIR / "graph.npz", allow_pickle=False)
GRAPHS = [mol_to_graph(Chem.MolFromSmiles(str(s))) for s in GRAPH["smiles"]]
FIELDS = ["f_atoms", "f_bonds", "a2b", "b2a", "b2revb", "a_scope", "b_scope", "a2a"]


@pytest.fixture(scope="module")
def batch() -> BatchMolGraph:
    return collate_graphs(GRAPHS)


@pytest.mark.parametrize("name", FIELDS)
def test_batch_component_equals_upstream(batch, name):
    got = getattr(batch, name)
    expected = torch.from_numpy(GRAPH[f"batch_{name}"])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected)


def test_component_order_and_max_degree(batch):
    assert [c.shape for c in batch.components()] == [tuple(GRAPH[f"batch_{n}"].shape) for n in FIELDS]
    assert batch.a2b.shape[1] == int(GRAPH["batch_max_num_bonds"])


def test_flat_input_gives_same_arrays_and_bondless_batch_has_min_width_one():
    flat = collate_arrays(FlatGraphs.from_graphs(GRAPHS))
    for name in FIELDS:
        np.testing.assert_array_equal(flat[name], GRAPH[f"batch_{name}"])
    ions = collate_graphs([mol_to_graph(Chem.MolFromSmiles(s)) for s in ("C", "[Na+].[Cl-]")])
    assert ions.a2b.shape == (4, 1) and int(ions.a2b.abs().sum()) == 0
    assert ions.b_scope.tolist() == [[1, 0], [1, 0]]
    assert ions.f_bonds.shape == (1, 165)
