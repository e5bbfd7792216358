"""Featurisation on the Ray cluster equals in-process featurisation, row for row, invalid rows included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from kermt.data.featurize import featurize_smiles
from kermt.data.tables import load_molecule_table
from kermt.data.arrow_molecules import FeaturizeBatch, molecules_from_table
from ray_app.common.featurize import featurize_on_cluster, in_input_order
from tests.conftest import FIXTURE_DIR


def test_cluster_featurisation_matches_in_process(ray_cluster):
    smiles = load_molecule_table(FIXTURE_DIR / "smiles.csv").smiles + ["", "C1CC", "[H][H]", "CCO"]
    on_cluster = featurize_on_cluster(smiles, ["rdkit_2d_normalized"], rows_per_task=7)
    local = featurize_smiles(smiles, ["rdkit_2d_normalized"])
    assert on_cluster.reasons == local.reasons
    assert on_cluster.reasons[-4:] == ("empty", "unparsable: unclosed ring for input: 'C1CC'", "no heavy atoms", None)
    expected = local.to_arrays()
    for name, value in on_cluster.to_arrays().items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


def test_blocks_with_wider_local_ids_concatenate():
    """A block holding a giant molecule carries int32 local ids; the others keep uint16; together they read back."""
    smiles = load_molecule_table(FIXTURE_DIR / "smiles.csv").smiles[:6]
    rows = pa.array(np.arange(6, dtype=np.int64))
    first, second = (FeaturizeBatch(())(pa.table({"row": rows[i:i + 3], "smiles": smiles[i:i + 3]})) for i in (0, 3))
    index_columns = ("bond_atoms", "bond_rdkit_idx")
    wide = second.cast(pa.schema([pa.field(f.name, pa.large_list(pa.int32())) if f.name in index_columns else f
                                  for f in second.schema]))
    together = molecules_from_table(pa.concat_tables([first, wide], promote_options="permissive"))
    expected = featurize_smiles(smiles).to_arrays()
    for name, value in together.to_arrays().items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    assert together.graphs.bond_atoms.dtype == np.int32


def test_blocks_out_of_input_order_are_put_back_in_order():
    """Only a check while Ray Data preserves order; blocks in any other order still read back row for row."""
    smiles = load_molecule_table(FIXTURE_DIR / "smiles.csv").smiles[:9]
    rows = pa.array(np.arange(9, dtype=np.int64))
    blocks = [FeaturizeBatch(())(pa.table({"row": rows[i:i + 3], "smiles": smiles[i:i + 3]})) for i in (0, 3, 6)]
    expected = featurize_smiles(smiles).to_arrays()
    for order in ((0, 1, 2), (2, 0, 1)):
        table = in_input_order(pa.concat_tables([blocks[k] for k in order]), len(smiles))
        for name, value in molecules_from_table(table).to_arrays().items():
            np.testing.assert_array_equal(value, expected[name], err_msg=f"{order} {name}")
    with pytest.raises(RuntimeError, match="returned 6 rows for 9 inputs"):
        in_input_order(pa.concat_tables(blocks[:2]), len(smiles))
