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
from kermt.explore.objective_spec import parse_objective
from kermt.explore.scorers import lookup_scorer
from kermt.run_layout import RunLayout
from ray_app.explore.library import READ_ROWS, open_library, write_lookup_scores

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
    assert [s for block in library.smiles_blocks() for s in block] == molecules


def test_a_header_only_library_is_refused(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("smiles\n")
    with pytest.raises(UserError, match="has no molecules"):
        open_library(str(path), None)


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_the_lookup_scores_streamed_in_blocks_are_the_bytes_of_the_whole_column_scored_at_once(molecules, suffix,
                                                                                                 tmp_path):
    """DIR/library_lookup_scores.npy, written one block of the library at a time, against what it was before: the
    whole SMILES column looked up in one call and np.save'd; across blocks, with the lookup's awkward rows."""
    unique = [s for s in dict.fromkeys(molecules) if s]
    rows = [("", "9.0"),  # the library's empty cell is looked up as ""
            (unique[0], ""), (unique[0], "1.5"), (unique[0], "2.5"),  # the first non-empty cell wins
            (unique[1], "n/a"), (unique[1], "3.0")]  # a cell that is not a number: NaN, the later row ignored
    rows += [(s, f"{i / 7:.6f}") for i, s in enumerate(unique[2:]) if i % 5]  # every 5th has no row at all
    lookup = tmp_path / "scores.csv.gz"
    pd.DataFrame(rows, columns=["smiles", "score"]).to_csv(lookup, index=False)
    path = tmp_path / f"library.{suffix}"
    frame = pd.DataFrame({"smiles": molecules})
    if suffix == "parquet":
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=10_000)
    else:
        frame.to_csv(path, index=False)
    spec = parse_objective(f"lookup:{lookup}:score")
    layout = RunLayout(tmp_path / "run")
    write_lookup_scores(spec, layout, open_library(str(path), None))

    before = tmp_path / "before.npy"  # the code before streaming: lookup_scorer(spec)(library.all_smiles())
    np.save(before, lookup_scorer(spec)(molecules).values.astype(np.float64))
    assert layout.explore_lookup_scores.read_bytes() == before.read_bytes()
    written = np.load(layout.explore_lookup_scores)
    assert len(written) == len(molecules) > READ_ROWS
    assert written[5] == 9.0 and written[molecules.index(unique[0])] == 1.5
    assert np.isnan(written[molecules.index(unique[1])]) and np.isnan(written[molecules.index(unique[7])])
