"""The driver holds no library (ray_app.explore.library.Library): it counts the rows once and reads the SMILES of the
rows a batch acquires from the file when asked, in the order asked, for CSV (also compressed) and Parquet, across
the blocks the file is read in."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kermt.errors import UserError
from ray_app.explore.library import READ_ROWS, open_library

DEMO = Path(__file__).resolve().parents[3] / "data" / "sample" / "admet_demo.csv"


@pytest.fixture(scope="module")
def molecules() -> list[str]:
    """More rows than one block holds (READ_ROWS), one empty cell among them."""
    smiles = pd.read_csv(DEMO)["smiles"].tolist()
    repeated = [s for _ in range(READ_ROWS // len(smiles) + 2) for s in smiles]
    repeated[5] = ""
    return repeated


@pytest.mark.parametrize("suffix", ["csv", "csv.gz", "parquet"])
def test_the_smiles_of_the_rows_asked_for_in_that_order(molecules, suffix, tmp_path):
    path = tmp_path / f"library.{suffix}"
    frame = pd.DataFrame({"id": range(len(molecules)), "SMILES": molecules})
    if suffix == "parquet":
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=10_000)
    else:
        frame.to_csv(path, index=False)
    library = open_library(str(path), None)
    assert [f.name for f in dataclasses.fields(library)] == ["path", "smiles_column", "rows"]  # no column held
    assert library.rows == len(molecules) > READ_ROWS and library.smiles_column == "SMILES"
    rows = np.random.default_rng(0).choice(len(molecules), 300, replace=False)
    asked = np.concatenate([rows, [len(molecules) - 1, 0, 5, rows[0]]])  # the last row, the first, an empty, a repeat
    assert library.smiles(asked) == [molecules[r] for r in asked]
    assert library.smiles(np.zeros(0, np.int64)) == []
    assert library.all_smiles() == molecules


def test_a_header_only_library_is_refused(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("smiles\n")
    with pytest.raises(UserError, match="has no molecules"):
        open_library(str(path), None)
