"""Featurised molecules as Arrow tables: SMILES rows -> one row per molecule (graph arrays as list columns, the
reason a row is invalid, molecule features), and back. Ragged graph arrays travel as Arrow list columns plus
per-row counts (no pickled objects), the layout that collates fastest; the same functions serve Ray Data's tasks
(``ray_app``) and an in-process stream (``kermt predict --engine local``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from kermt.chem.molgraph import RAGGED_WIDTH, FlatGraphs
from kermt.chem.standardize import MoleculePrep
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.data.ragged import flat_values, list_column, offsets_of
from kermt.inference.columns import MODEL_SMILES_COLUMN


class FeaturizeBatch:
    """A pyarrow batch with a ``smiles`` column -> one featurised row per input row, each
    molecule prepared as ``prep`` says (heavy-atom limit, the model's standardisation)."""

    def __init__(self, features_generator: Sequence[str], prep: MoleculePrep = MoleculePrep()) -> None:
        self.features_generator = tuple(features_generator)
        self.prep = prep

    def __call__(self, batch: pa.Table) -> pa.Table:
        smiles = [s if s is not None else "" for s in batch.column("smiles").to_pylist()]
        done = featurize_smiles(smiles, self.features_generator, prep=self.prep)
        graphs = done.graphs
        columns = {
            "row": batch.column("row"),
            "smiles": pa.array(smiles, pa.string()),
            "reason": pa.array([r or "" for r in done.reasons], pa.string()),
            MODEL_SMILES_COLUMN: pa.array(done.model_smiles, pa.string()),
            "atom_counts": pa.array(graphs.atom_counts),
            "bond_counts": pa.array(graphs.bond_counts),
            "features": list_column(done.features, offsets_of(np.ones(len(smiles), np.int64))),
        }
        arrays = graphs.to_arrays()
        for name in RAGGED_WIDTH:  # the compact store's arrays travel as they are (uint8 codes, uint16 ids)
            counts = graphs.atom_counts if name.startswith("atom_") else graphs.bond_counts
            columns[name] = list_column(arrays[name], offsets_of(counts))
        return pa.table(columns)


def molecules_from_table(table: pa.Table, features_generator: Sequence[str] = ()) -> FeaturizedMolecules:
    """FeaturizeBatch's columns (any number of rows, in table order) back as FeaturizedMolecules."""
    n = table.num_rows
    arrays = {name: flat_values(table, name) for name in RAGGED_WIDTH}
    arrays.update({name: table.column(name).to_numpy() for name in ("atom_counts", "bond_counts")})
    flat = flat_values(table, "features").astype(np.float64, copy=False)
    return FeaturizedMolecules(
        smiles=tuple(table.column("smiles").to_pylist()),
        reasons=tuple(r or None for r in table.column("reason").to_pylist()),
        graphs=FlatGraphs.from_arrays(arrays),
        features=flat.reshape(n, len(flat) // n if n else 0),
        features_generator=tuple(features_generator),
        model_smiles=(tuple(table.column(MODEL_SMILES_COLUMN).to_pylist())  # dropped where nothing standardises
                      if MODEL_SMILES_COLUMN in table.column_names else ()),
    )


__all__ = ["FeaturizeBatch", "molecules_from_table"]
