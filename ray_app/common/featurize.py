"""Featurisation on the Ray cluster: SMILES rows -> Ray Data map_batches (CPU tasks) -> FeaturizedMolecules.

Rows are featurised once per run, in parallel, and come back in input order (``preserve_order``). Ragged graph
arrays travel as Arrow list columns plus per-row counts (no pickled objects), the layout that collates fastest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import ray

from kermt.chem.molgraph import RAGGED_WIDTH, FlatGraphs
from kermt.chem.standardize import MoleculePrep
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.data.ragged import flat_values, list_column, offsets_of
from kermt.inference.columns import MODEL_SMILES_COLUMN
from ray_app.common.progress import Progress


class FeaturizeBatch:
    """map_batches function: a pyarrow batch with a ``smiles`` column -> one featurised row per input row, each
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


def featurize_on_cluster(
    smiles: Sequence[str], features_generator: Sequence[str] = (), rows_per_task: int = 512,
    label: str = "featurising", prep: MoleculePrep = MoleculePrep()
) -> FeaturizedMolecules:
    """Featurise ``smiles`` with Ray Data CPU tasks, each molecule prepared as ``prep`` says; the result is
    row-aligned with the input. A long run prints progress lines headed ``label``."""
    generators = tuple(features_generator)
    if not smiles:
        return featurize_smiles([], generators, prep=prep)
    source = pa.table({"row": pa.array(np.arange(len(smiles), dtype=np.int64)), "smiles": pa.array(list(smiles))})
    ds = ray.data.from_arrow(source).repartition(max(1, -(-len(smiles) // rows_per_task)))
    ds = ds.map_batches(FeaturizeBatch(generators, prep), batch_format="pyarrow", batch_size=None, num_cpus=1)
    # One map stage whose outputs are all collected: Ray Data's per-operator reservation has nothing to protect
    # here, and it held this stage to one task at a time for long stretches (200k molecules on 2 CPUs: 77 % busy
    # with it, 95 % without). This dataset's own context: the multi-stage pipelines (screening, corpus) keep the
    # reservation.
    ds.context.op_resource_reservation_enabled = False
    # permissive: a block with a molecule of > 65,536 atoms carries int32 local ids where the others carry uint16
    progress = Progress(label, total=len(smiles))
    blocks = []
    for block in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
        blocks.append(block)
        progress.advance(block.num_rows)
    progress.finish()
    table = pa.concat_tables(blocks, promote_options="permissive")
    return molecules_from_table(in_input_order(table, len(smiles)), generators)


def in_input_order(table: pa.Table, n: int) -> pa.Table:
    """FeaturizeBatch rows of inputs 0..n-1 (any block order) -> the same rows in input order.

    preserve_order (ray_app.common.cluster.connect) returns the blocks in input order, so this is a check; sorting
    regardless would cost ~3 KB of transient driver memory per molecule (Arrow's take over the list columns), 3 GB
    at 1M molecules.
    """
    if table.num_rows != n:
        raise RuntimeError(f"featurisation returned {table.num_rows} rows for {n} inputs")
    if np.array_equal(table.column("row").to_numpy(), np.arange(n)):
        return table
    return table.sort_by("row")


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
