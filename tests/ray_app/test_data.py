"""Featurisation on the Ray cluster equals in-process featurisation, row for row, invalid rows included."""

from __future__ import annotations

import numpy as np

from kermt.data.featurize import featurize_smiles
from kermt.data.tables import load_molecule_table
from ray_app.data import featurize_on_cluster
from tests.conftest import FIXTURE_DIR


def test_cluster_featurisation_matches_in_process(ray_cluster):
    smiles = load_molecule_table(FIXTURE_DIR / "smiles.csv").smiles + ["", "C1CC", "[H][H]", "CCO"]
    on_cluster = featurize_on_cluster(smiles, ["rdkit_2d_normalized"], rows_per_task=7)
    local = featurize_smiles(smiles, ["rdkit_2d_normalized"])
    assert on_cluster.reasons == local.reasons
    assert on_cluster.reasons[-4:] == ("empty", "unparsable", "no heavy atoms", None)
    expected = local.to_arrays()
    for name, value in on_cluster.to_arrays().items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
