"""`kermt predict` / `fingerprint` read every distributed library format and give what the plain CSV gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ray_app.screening.commands import main_fingerprint, main_predict
from tests.conftest import FIXTURE_DIR
from tests.kermt.data.test_formats import fixture_frame, write_formats

CHECKPOINT = str(FIXTURE_DIR / "ckpt_ft_cls.pt")  # no descriptors: keeps the runs fast


# One reader per kind runs by default (a compressed CSV, Parquet, a SMILES file with a header); the other spellings
# of the same readers (gzip next to zstd, tab-separated and headerless SMILES) run with -m slow, and
# tests/kermt/data/test_formats.py reads every one of them in-process.
@pytest.mark.parametrize("formats", [("csv.zst", "parquet", "smi"),
                                     pytest.param(("csv.gz", "smi.gz", "cxsmiles"), marks=pytest.mark.slow)])
def test_predictions_are_identical_for_every_input_format(ray_cluster, tmp_path, formats):
    frame = fixture_frame()
    frame.loc[5, "smiles"] = "not_a_smiles"  # an invalid row keeps its place in every format
    paths = write_formats(frame, tmp_path)
    outputs = {}
    for key in ("csv", *formats):
        out = tmp_path / f"out_{key}.csv"
        ids = ["--id_columns", "name"] if key in ("csv", "csv.gz", "csv.zst", "parquet") else []  # .smi: default
        assert main_predict(["--data_path", str(paths[key]), "--checkpoint_path", CHECKPOINT, "--output_path",
                             str(out), "--batch_size", "8", *ids]) == 0, key
        outputs[key] = pd.read_csv(out, keep_default_na=False, dtype=str)
    expected = outputs.pop("csv")
    assert list(expected.columns) == ["smiles", "c1", "c2", "name", "valid", "error"]
    assert expected["name"].tolist() == frame["name"].tolist() and expected["valid"].tolist().count("false") == 1
    for key, got in outputs.items():
        if key.startswith("smi"):  # the header names the columns: "SMILES Name"; none: the defaults
            got = got.rename(columns={"SMILES": "smiles", "Name": "name"})
        pd.testing.assert_frame_equal(got, expected, obj=key)  # same rows, ids and numbers as text, bit for bit


def test_fingerprints_of_a_compressed_smiles_file_equal_the_csv(ray_cluster, tmp_path):
    paths = write_formats(fixture_frame(), tmp_path)
    arrays = []
    for key in ("csv", "smi.gz"):
        out = tmp_path / f"fps_{key}.npz"
        assert main_fingerprint(["--data_path", str(paths[key]), "--checkpoint_path",
                                 str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"), "--output_path", str(out)]) == 0
        with np.load(out) as saved:
            arrays.append((saved["fps"], saved["valid"]))
    assert arrays[0][0].shape == (26, 64) and arrays[0][1].all()
    np.testing.assert_array_equal(arrays[1][0], arrays[0][0])
    np.testing.assert_array_equal(arrays[1][1], arrays[0][1])


def test_a_malformed_csv_found_by_a_read_task_is_a_user_error(ray_cluster, tmp_path, capsys):
    (tmp_path / "ragged.csv").write_text("smiles,name\nCCO,a\nCCC,b,extra\n")
    assert main_predict(["--data_path", str(tmp_path / "ragged.csv"), "--checkpoint_path", CHECKPOINT,
                         "--output_path", str(tmp_path / "o.csv")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("kermt predict: error: ") and "ragged.csv: malformed CSV" in last
    assert not (tmp_path / "o.csv").exists()
