"""A library featurised once and predicted many times (kermt explore predicts its library every round).

``DIR/shard_000000.parquet``, ``shard_000001.parquet``, ...: :func:`ray_app.screening.stream.featurize_block`'s
rows for the input's rows in order, about ``rows_per_block`` rows a shard, and ``DIR/manifest.json``: the row count,
the shards and how many rows each holds (Ray Data's blocks need not be of one size), and how the rows were
featurised (the SMILES column, the molecule features, the standardisation, the heavy-atom limit). A model predicts
from them only when it featurises the same way (:func:`check_fit`), so a prediction from the shards equals one from
the SMILES.

Writing: the driver takes the featurised blocks in input order and writes each as one shard, holding one block at a
time (the library never sits in its memory). The blocks are computed in this process for a small local input and
on Ray Data otherwise (the ``--engine auto`` rule, :func:`ray_app.screening.engines.auto_engine`). The shards go
to a ``.partial`` folder renamed when the manifest is written, so a stopped featurisation leaves no shards to reuse.

Reading: :meth:`Shards.take` reads one column at some rows (kermt explore: the SMILES of a round's batch) from
only the shards that hold them, found from the manifest's rows per shard. Predicting reads one shard at a time
through the model in this process, or Ray Data's Parquet reader feeding the model actors; either way no molecule is
featurised again. On a cluster of several machines DIR must be storage every node reads (the actors read the shards
where they run).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kermt.chem.standardize import MoleculePrep
from kermt.errors import UserError
from kermt.inference import FeaturePlan
from ray_app.screening.config import ModelScreeningConfig
from ray_app.screening.files import InputTable
from ray_app.screening.local import read_blocks, torch_threads
from ray_app.screening.stream import (InputSpec, PredictStage, blocks_of, connect_actors, featurised_dataset,
                                      featurize_block, model_stage, rows_per_block)

MANIFEST = "manifest.json"
SHARD_NAME = "shard_{:06d}.parquet"


@dataclass(frozen=True)
class Shards:
    """A featurised input: ``rows`` rows in ``files`` (names in ``directory``, in row order, ``shard_rows`` rows
    each; empty where the manifest predates that record), featurised as ``spec`` says."""

    directory: Path
    rows: int
    files: tuple[str, ...]
    spec: InputSpec
    shard_rows: tuple[int, ...] = ()

    @property
    def paths(self) -> list[str]:
        return [str(self.directory / name) for name in self.files]

    def holding(self, rows: Sequence[int]) -> np.ndarray:
        """The shard of each input row of ``rows``. Needs ``shard_rows``."""
        if len(self.shard_rows) != len(self.files):
            raise ValueError(f"{self.directory / MANIFEST} does not say how many rows each shard holds")
        return np.searchsorted(np.cumsum(self.shard_rows), np.asarray(rows, dtype=np.int64), side="right")

    def take(self, rows: Sequence[int], column: str) -> list:
        """``column``'s values at input rows ``rows``, in that order, reading that column of only the shards that
        hold them (one at a time). Needs ``shard_rows``."""
        wanted, holder = np.asarray(rows, dtype=np.int64), self.holding(rows)
        starts = np.cumsum(self.shard_rows) - self.shard_rows
        order = np.argsort(holder, kind="stable")  # the rows asked for, shard by shard
        indices, firsts = np.unique(holder[order], return_index=True)
        found: list = [None] * len(wanted)
        for index, at in zip(indices.tolist(), np.split(order, firsts[1:])):
            local = wanted[at] - starts[index]
            # ParquetFile, not read_table (a dataset per call): 0.6-2 s against 5.6-9 s for 977 shards, load 33
            with pq.ParquetFile(self.directory / self.files[index], pre_buffer=False) as shard:
                cells = shard.read(columns=[column]).column(0)
            for position, cell in zip(at.tolist(), cells.take(pa.array(local)).to_pylist()):
                found[position] = cell
        return found


def _record(spec: InputSpec) -> dict:
    return {"smiles_column": spec.smiles_column, "features_generator": list(spec.features_generator),
            "standardize": spec.prep.standardize, "max_heavy_atoms": spec.prep.max_heavy_atoms}


def read_shards(directory: Path) -> Shards | None:
    """The shards written in ``directory`` (None: none, or a featurisation that did not finish)."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return None
    data = json.loads(manifest.read_text())
    spec = InputSpec(data["smiles_column"], features_generator=tuple(data["features_generator"]),
                     prep=MoleculePrep(data["standardize"], data["max_heavy_atoms"]))
    return Shards(directory, int(data["rows"]), tuple(data["files"]), spec, tuple(data.get("shard_rows", ())))


def write_shards(table: InputTable, spec: InputSpec, directory: Path, address: str | None,
                 batch_size: int, engine: str | None = None) -> Shards:
    """``table`` featurised as ``spec`` says into ``directory`` (replacing what is there); its shards. ``engine``:
    "local" or "ray" as the caller already chose (and logged) it; None: ``--engine auto``'s choice, logged here."""
    from ray_app.screening.engines import auto_engine

    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    block = rows_per_block(batch_size)
    if (engine or auto_engine(table.path, address)) == "local":
        blocks: Iterator[pa.Table] = (featurize_block(b, spec) for b in read_blocks(table, spec.read_columns, block))
    else:
        from ray_app.common.cluster import connect

        connect(address)
        blocks = blocks_of(featurised_dataset(table, spec, batch_size))
    files, counts = [], []
    for index, featurised in enumerate(blocks):
        files.append(SHARD_NAME.format(index))
        pq.write_table(featurised, staging / files[-1])
        counts.append(featurised.num_rows)  # Ray Data's blocks need not be of one size
    record = {"rows": sum(counts), "files": files, **_record(spec), "shard_rows": counts}
    (staging / MANIFEST).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    return Shards(directory, sum(counts), tuple(files), spec, tuple(counts))


def check_fit(shards: Shards, plan: FeaturePlan, max_heavy_atoms: int) -> None:
    """A one-line error unless the model of ``plan`` featurises molecules as the shards were featurised."""
    wanted = InputSpec(shards.spec.smiles_column, features_generator=plan.generator,
                       prep=plan.prep(max_heavy_atoms))
    if plan.from_file or _record(wanted) != _record(shards.spec):
        raise UserError(f"the featurised library {shards.directory} was featurised as {_record(shards.spec)}, the "
                        f"model needs {_record(wanted)}; remove {shards.directory} to featurise it again")


def predict_shards(config: ModelScreeningConfig, shards: Shards, stage_kwargs: dict) -> Iterator[pa.Table]:
    """PredictStage's output blocks for the shards' rows, in row order (``config.engine`` resolved)."""
    kwargs = {**stage_kwargs, "batch_size": config.batch_size, "use_gpu": config.use_gpu}
    if config.engine == "local":
        return _in_process(shards, kwargs, max(1, int(config.cpus_per_actor)))
    import ray

    concurrency = connect_actors(config)
    ds = ray.data.read_parquet(shards.paths, shuffle=None)
    block = rows_per_block(config.batch_size)
    ds = ds.repartition(target_num_rows_per_block=block, strict=True)
    return blocks_of(model_stage(ds, PredictStage, kwargs, block, concurrency, config.cpus_per_actor,
                                 config.num_gpus_per_actor if config.use_gpu else 0))


def _in_process(shards: Shards, kwargs: dict, threads: int) -> Iterator[pa.Table]:
    with torch_threads(threads):
        model = PredictStage(**kwargs)
        for path in shards.paths:
            yield model(pq.read_table(path))


__all__ = ["MANIFEST", "Shards", "check_fit", "predict_shards", "read_shards", "write_shards"]
