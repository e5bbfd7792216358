"""`kermt predict` carries the input's other columns into the prediction file by default (as chemprop does), in
input order and as text; `--drop_extra_columns` leaves them out. Real local Ray, real files."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ray_app.screening.commands import main_predict
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import SMILES

CHECKPOINT = str(FIXTURE_DIR / "ckpt_ft_cls.pt")  # tasks c1, c2; no molecule features (fast)


def _library(rows: int = 12) -> pd.DataFrame:
    """An id before the SMILES, a label column named like the model's task c1, a number and a text with a comma;
    one invalid SMILES, which keeps its row and its columns."""
    smiles = (SMILES * 2)[:rows]
    smiles[3] = "not_a_smiles"
    return pd.DataFrame({"compound": [f"cpd-{i}" for i in range(rows)], "smiles": smiles,
                         "c1": [i % 2 for i in range(rows)], "mw": [100.5 + i for i in range(rows)],
                         "note": [f"batch {i // 4}, plate A" for i in range(rows)]})


def _predict(tmp_path, data, name: str, *flags: str) -> pd.DataFrame:
    out = tmp_path / name
    assert main_predict(["--data_path", str(data), "--checkpoint_path", CHECKPOINT, "--smiles_column", "smiles",
                         "--output_path", str(out), "--batch_size", "5", *flags]) == 0
    return pd.read_csv(out, dtype=str, keep_default_na=False)


def test_other_columns_are_carried_by_default_and_dropped_on_request(ray_cluster, tmp_path, capsys):
    frame = _library()
    frame.to_csv(tmp_path / "library.csv", index=False)
    carried = _predict(tmp_path, tmp_path / "library.csv", "carried.csv")
    # c1 is the prediction's own column: the input's label column of that name is left out, and the log says so
    assert "input columns not carried to the output: c1 (an output column)" in capsys.readouterr().err
    assert list(carried.columns) == ["smiles", "c1", "c2", "compound", "mw", "note", "valid", "error"]
    assert carried["smiles"].tolist() == frame["smiles"].tolist()  # input order, the invalid row in place
    assert carried["compound"].tolist() == frame["compound"].tolist()
    assert carried["mw"].tolist() == [f"{v}" for v in frame["mw"]]
    assert carried["note"].tolist() == frame["note"].tolist()
    assert carried["valid"].tolist() == ["true" if i != 3 else "false" for i in range(len(frame))]
    assert carried["c1"][3] == "" and 0 < float(carried["c1"][0]) < 1  # probabilities, not the input's 0/1 labels

    dropped = _predict(tmp_path, tmp_path / "library.csv", "dropped.csv", "--drop_extra_columns")
    assert list(dropped.columns) == ["smiles", "c1", "c2", "valid", "error"]
    pd.testing.assert_frame_equal(dropped, carried[list(dropped.columns)])  # the same predictions


def test_a_parquet_column_with_no_text_form_is_left_out(ray_cluster, tmp_path, capsys):
    frame = _library(6)
    table = pa.Table.from_pandas(frame, preserve_index=False).append_column(
        "fingerprint", pa.array([[float(i), 1.0] for i in range(len(frame))]))
    pq.write_table(table, tmp_path / "library.parquet")
    carried = _predict(tmp_path, tmp_path / "library.parquet", "carried.csv")
    assert "input columns not carried to the output: c1 (an output column), fingerprint (not text)" in (
        capsys.readouterr().err)
    assert list(carried.columns) == ["smiles", "c1", "c2", "compound", "mw", "note", "valid", "error"]
    assert carried["note"].tolist() == frame["note"].tolist()
