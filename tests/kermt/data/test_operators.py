"""The neighbour-sum operators built in numpy at collate time, against upstream's padded gather-and-sum, and what
a batch carries to the device (operators, transposes, host-known widths)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kermt.data.batch import GRAPH_ARRAYS
from kermt.data.collate import collate_graphs
from kermt.data.featurize import featurize_smiles
from kermt.data.operators import OPERATOR_NAMES, OperatorSpec, operators_of
from kermt.data.tables import load_molecule_table
from tests.conftest import FIXTURE_DIR
from tests.kermt.nn.upstream_fixtures import fixture_batch


def _gather_sums(graph, padding: str, atoms: torch.Tensor, bonds: torch.Tensor) -> dict[str, torch.Tensor]:
    """Upstream's index-list sums (a padding slot adds row 0); "zero" mode leaves the padding slots out."""
    def summed(x, index):
        gathered = x[index]
        if padding == "zero":
            gathered = gathered * (index != 0).unsqueeze(-1).to(x.dtype)
        return gathered.sum(dim=1)

    around = torch.cat([graph.b2a.unsqueeze(1), graph.a2a[graph.b2a]], dim=1)
    return {
        "incoming_bonds": summed(bonds, graph.a2b),
        "neighbour_atoms": summed(atoms, graph.a2a),
        "bond_update": summed(bonds, graph.a2b[graph.b2a]) - bonds[graph.b2revb],
        "atom_to_bond": summed(atoms, around) - atoms[graph.b2a[graph.b2revb]],
    }


@pytest.mark.parametrize("padding", ["upstream", "zero"])
def test_operators_sum_what_upstreams_index_lists_sum(padding):
    graph = fixture_batch()  # collated by upstream's own code
    operators = operators_of(graph, OperatorSpec(padding, OPERATOR_NAMES, transposes=True))
    generator = torch.Generator().manual_seed(0)
    atoms = torch.randn(graph.f_atoms.shape[0], 3, dtype=torch.float64, generator=generator)
    bonds = torch.randn(graph.f_bonds.shape[0], 3, dtype=torch.float64, generator=generator)
    expected = _gather_sums(graph, padding, atoms, bonds)
    for name in OPERATOR_NAMES:
        dense = operators.matrices[name].matrix(torch.float64).to_dense()
        x = atoms if dense.shape[1] == atoms.shape[0] else bonds
        torch.testing.assert_close(dense @ x, expected[name], rtol=0, atol=1e-12, msg=name)
        transposed = operators.transposes[name].matrix(torch.float64).to_dense()
        torch.testing.assert_close(transposed, dense.T, rtol=0, atol=0, msg=name)


def test_the_collate_builds_what_the_spec_names_and_the_largest_molecule():
    molecules = featurize_smiles(load_molecule_table(FIXTURE_DIR / "smiles.csv").smiles).graphs
    spec = OperatorSpec("upstream", ("neighbour_atoms", "bond_update"), transposes=False)
    graph = collate_graphs(molecules, spec)
    assert set(graph.operators.matrices) == {"neighbour_atoms", "bond_update"} and not graph.operators.transposes
    assert graph.max_atoms == int(graph.a_scope[:, 1].max()) and graph.max_bonds == int(graph.b_scope[:, 1].max())
    rebuilt = operators_of(graph, spec)  # from the collated index arrays, as a batch without operators gets them
    for name, operator in graph.operators.matrices.items():
        for part in ("crow", "col", "values"):
            assert torch.equal(getattr(operator, part), getattr(rebuilt.matrices[name], part)), (name, part)
    empty = collate_graphs(molecules.select(np.zeros(0, dtype=np.int64)), spec)
    assert empty.max_atoms == empty.max_bonds == 0
    assert empty.operators.matrices["neighbour_atoms"].shape == (1, 1)


def test_moving_a_batch_keeps_every_array_and_the_host_values():
    molecules = featurize_smiles(["CCO", "c1ccccc1"]).graphs
    graph = collate_graphs(molecules, OperatorSpec("zero", ("incoming_bonds",), transposes=True))
    moved = graph.to("cpu", non_blocking=True)
    for name in GRAPH_ARRAYS:
        assert torch.equal(getattr(moved, name), getattr(graph, name))
    assert moved.components() == tuple(getattr(moved, name) for name in GRAPH_ARRAYS)
    assert (moved.max_atoms, moved.operators.padding) == (6, "zero")
    incoming = moved.operators.transposes["incoming_bonds"]
    assert torch.equal(incoming.col, graph.operators.transposes["incoming_bonds"].col)
