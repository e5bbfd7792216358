"""The library is featurised once (DIR/library/, ray_app.explore.library.featurised_library): the first round that
predicts writes the shards, every later round and a resumed exploration read them without featurising again, and
they are the molecules the surrogate's settings featurise (its molecule features, standardisation, heavy-atom
limit). The slow lane checks the same through whole rounds (test_explore_greedy.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from kermt.chem.standardize import MoleculePrep
from kermt.run_layout import RunLayout
from ray_app.common.settings import resolve
from ray_app.explore.config import ExploreConfig
from ray_app.explore.library import featurised_library, open_library

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
    first = featurised_library(config, layout, opened, batch_size=32)
    written = _stamps(layout.explore_library)
    assert first.rows == 40 and set(written) == {"manifest.json", "shard_000000.parquet"}
    for _ in range(2):  # round 2, then a resumed exploration (a new process reads the same folder)
        again = featurised_library(config, layout, open_library(str(library), None), batch_size=32)
        assert again == first and _stamps(layout.explore_library) == written  # nothing written again
    rows = pq.read_table(layout.explore_library / first.files[0])
    assert rows.column("smiles").to_pylist() == pd.read_csv(library)["smiles"].tolist()
    assert rows.column("reason").null_count == 0 and "atom_counts" in rows.column_names  # featurised rows
    # the surrogate's featurisation: finetune's standardisation ('parent'), the flag's limit, no molecule features
    assert (first.spec.prep, first.spec.features_generator) == (MoleculePrep("parent", 30), ())
