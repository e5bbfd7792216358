"""Featurisation on the Ray cluster: SMILES rows -> Ray Data map_batches (CPU tasks) -> FeaturizedMolecules.

Rows are featurised once per run, in parallel, and come back in input order (``preserve_order``), as the Arrow
tables of :mod:`kermt.data.arrow_molecules`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import ray

from kermt.chem.standardize import MoleculePrep
from kermt.data.arrow_molecules import FeaturizeBatch, molecules_from_table
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from ray_app.common.progress import Progress


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


__all__ = ["featurize_on_cluster", "in_input_order"]
