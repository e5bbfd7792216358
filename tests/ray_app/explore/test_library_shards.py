"""The library is featurised once (DIR/library/, ray_app.explore.library.featurised_library): the first round that
predicts writes the shards, every later round and a resumed exploration read them without featurising again, and
they are the molecules the surrogate's settings featurise (its molecule features, standardisation, heavy-atom
limit). The slow lane checks the same through whole rounds (test_explore_greedy.py). Once they exist, a batch's
SMILES are read from them (batch_smiles), from only the shards that hold the batch's rows (Shards.take)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kermt.chem.standardize import MoleculePrep
from kermt.run_layout import RunLayout
from ray_app.common.settings import resolve
from ray_app.explore.config import ExploreConfig
from ray_app.explore.library import batch_smiles, featurised_library, open_library
from ray_app.screening.shards import MANIFEST, Shards
from ray_app.screening.stream import InputSpec

DEMO = Path(__file__).resolve().parents[3] / "data" / "sample" / "admet_demo.csv"


def _stamps(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(directory.iterdir())}


def test_the_library_is_featurised_once_and_read_by_every_later_round(tmp_path):
    library = tmp_path / "lib.csv"
    pd.read_csv(DEMO).head(40).to_csv(library, index=False)
    config = resolve(["--library", str(library), "--objective", f"lookup:{library}:logp", "--init_size", "10",
                      "--acquire_size", "5", "--iterations", "2", "--save_dir", str(tmp_path / "run"),
                      "--max_heavy_atoms", "30"], ExploreConfig, "kermt explore")[0]
    layout, opened = RunLayout(tmp_path / "run"), open_library(str(library), None)
    batch, demo = np.array([39, 0, 17, 3]), pd.read_csv(DEMO)
    assert batch_smiles(layout, opened, batch) == demo["smiles"].to_numpy()[batch].tolist()  # no shards: the file
    first = featurised_library(config, layout, opened, batch_size=32)
    written = _stamps(layout.explore_library)
    assert first.rows == 40 and set(written) == {"manifest.json", "shard_000000.parquet"}
    assert first.shard_rows == (40,)  # the manifest says how many rows each shard holds
    for _ in range(2):  # round 2, then a resumed exploration (a new process reads the same folder)
        again = featurised_library(config, layout, open_library(str(library), None), batch_size=32)
        assert again == first and _stamps(layout.explore_library) == written  # nothing written again
    rows = pq.read_table(layout.explore_library / first.files[0])
    assert rows.column("smiles").to_pylist() == pd.read_csv(library)["smiles"].tolist()
    assert rows.column("reason").null_count == 0 and "atom_counts" in rows.column_names  # featurised rows
    # the surrogate's featurisation: finetune's standardisation ('parent'), the flag's limit, no molecule features
    assert (first.spec.prep, first.spec.features_generator) == (MoleculePrep("parent", 30), ())
    _a_batchs_smiles_come_from_the_shards(layout, library, batch, demo)


def _a_batchs_smiles_come_from_the_shards(layout: RunLayout, library: Path, batch: np.ndarray,
                                          demo: pd.DataFrame) -> None:
    demo.tail(40).to_csv(library, index=False)  # the file now says otherwise: what is read shows where from
    opened = open_library(str(library), None)
    shards = demo["smiles"].to_numpy()[batch].tolist()
    assert batch_smiles(layout, opened, batch, rows_per_shard_read=40) == shards  # one shard for 40 rows: the shards
    in_file = demo["smiles"].tail(40).to_numpy()[batch].tolist()
    assert in_file != shards and batch_smiles(layout, opened, batch, rows_per_shard_read=41) == in_file  # the file
    manifest = layout.explore_library / MANIFEST  # and any batch once the manifest does not say the shards' rows
    record = json.loads(manifest.read_text())
    del record["shard_rows"]  # a manifest written before it said how many rows each shard holds: the file
    manifest.write_text(json.dumps(record))
    assert batch_smiles(layout, opened, batch, rows_per_shard_read=1) == in_file


def test_take_reads_the_rows_asked_for_from_uneven_shards(tmp_path):
    smiles = [f"C{'C' * i}O" for i in range(10)]
    files, start = [], 0
    for index, size in enumerate((3, 5, 2)):  # Ray Data's blocks need not be of one size
        files.append(f"shard_{index}.parquet")
        pq.write_table(pa.table({"smiles": smiles[start:start + size]}), tmp_path / files[-1])
        start += size
    shards = Shards(tmp_path, 10, tuple(files), InputSpec("smiles"), (3, 5, 2))
    rows = [9, 0, 3, 7, 8, 2, 3]
    assert shards.take(rows, "smiles") == [smiles[r] for r in rows]
    assert shards.take([], "smiles") == []
