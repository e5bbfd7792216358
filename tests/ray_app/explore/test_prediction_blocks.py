"""A round's acquisition read from its predictions file one block at a time (ray_app.explore.surrogate's
prediction_blocks into kermt.explore.blocks) chooses exactly the rows the whole-array acquisition chose before it
(the whole file read, acquisition_values, top_batch), for every acquisition, seed and direction, ties included.

The file is written as run_predict writes a round's predictions (its TableWriter, whose row groups of at most
65,536 rows the blocks cross; the columns `kermt predict --uncertainty` names): the demo library's logP as the
mean, tiled 40 times (80,000 rows: every value tied 40 times, enough rows for the running top to be cut back),
empty where the demo has none (an invalid row's null), and a std on a coarse grid with zeros."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kermt.explore.acquisition import Surrogate, acquisition_values, random_batch, round_rng, top_batch
from kermt.explore.blocks import acquire_in_blocks, random_rows
from kermt.registry import ACQUISITIONS
from ray_app.explore.surrogate import prediction_blocks
from ray_app.screening.files import TableWriter

DEMO = Path(__file__).resolve().parents[3] / "data" / "sample" / "admet_demo.csv"
TILES = 40


@pytest.fixture(scope="module")
def predictions(tmp_path_factory) -> Path:
    logp = np.tile(pd.read_csv(DEMO)["logp"].to_numpy(np.float64), TILES)
    std = np.abs(np.round(np.random.default_rng(0).normal(0, 0.4, len(logp)), 1))
    path = tmp_path_factory.mktemp("round_1") / "library_predictions.parquet"
    writer = TableWriter(path)
    for start in range(0, len(logp), 7_777):  # uneven writes, as a prediction's blocks come
        block = slice(start, start + 7_777)
        writer.write(pa.table({"smiles": [""] * len(logp[block]),
                               "score": pa.array(logp[block], from_pandas=True),  # NaN -> null, as invalid rows
                               "score_std": std[block]}))
    writer.commit()
    return path


def _whole(path: Path) -> Surrogate:
    """The file read whole, as the driver read it before the blocks."""
    table = pq.read_table(path, columns=["score", "score_std"])
    return Surrogate(*(table.column(c).to_numpy().astype(np.float64) for c in ("score", "score_std")))


def test_the_file_holds_nulls_and_several_row_groups(predictions):
    # 9 writes reach 65,536 rows: their 69,993 rows are written as 65,536 + 4,457, the last 10,007 at the commit
    groups = pq.ParquetFile(predictions).metadata
    assert [groups.row_group(i).num_rows for i in range(groups.num_row_groups)] == [65_536, 4_457, 10_007]
    assert pq.read_table(predictions).column("score").null_count == 416 * TILES  # the demo's rows without logP
    assert sum(len(s.mean) for _, s in prediction_blocks(predictions, 2000 * TILES, 30_000)) == 2000 * TILES


@pytest.mark.parametrize("acquisition", ACQUISITIONS)
def test_blocks_choose_the_whole_files_batch(predictions, acquisition):
    whole = _whole(predictions)
    rows = len(whole.mean)
    explored = np.random.default_rng(5).choice(rows, 1_500, replace=False)
    excluded = np.zeros(rows, dtype=bool)
    excluded[explored] = True
    for seed, minimize, size, block_rows in ((0, False, 800, 65_536), (1, True, 50, 10_000),
                                             (2, False, 30_000, 4_096)):
        best = 3.1 if not minimize else -0.4
        values = acquisition_values(acquisition, whole, best, round_rng(seed, 1), minimize=minimize)
        expected = top_batch(values, excluded, size)
        chosen = acquire_in_blocks(acquisition, prediction_blocks(predictions, rows, block_rows), explored, size,
                                   best, round_rng(seed, 1), minimize=minimize)
        np.testing.assert_array_equal(chosen.rows, expected)
        np.testing.assert_array_equal(chosen.values, values[expected])
        np.testing.assert_array_equal(chosen.mean, whole.mean[expected])
        np.testing.assert_array_equal(chosen.std, whole.std[expected])
        if acquisition in ("greedy", "pi") and size < 10_000:
            assert len(np.unique(values[expected])) < size  # ties at the cut, decided by row
    # --acquisition random draws its batch without values: the same rows as the whole mask's draw
    np.testing.assert_array_equal(random_rows(explored, rows, 800, round_rng(0, 2)),
                                  random_batch(excluded, 800, round_rng(0, 2)))


def test_a_file_of_another_length_is_refused(predictions):
    with pytest.raises(Exception, match="holds 80,000 predictions for a library of 79,999 rows"):
        next(prediction_blocks(predictions, 79_999))
