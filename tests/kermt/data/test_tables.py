from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kermt.data.formats import row_place
from kermt.data.tables import (
    check_classification_labels,
    infer_dataset_type,
    load_molecule_table,
)
from tests.conftest import FIXTURE_DIR


def test_fixture_csv_targets_and_missing_labels():
    table = load_molecule_table(FIXTURE_DIR / "smiles.csv")
    assert table.target_names == ["t1", "t2"] and len(table) == 26
    assert table.smiles[0] == "CC(=O)Oc1ccccc1C(=O)O"
    assert table.targets[0].tolist() == [1.25, 0.3]
    assert np.isnan(table.targets[4, 1]) and np.isnan(table.targets[10, 1])
    assert np.isnan(table.targets).sum() == 2
    assert infer_dataset_type(table.targets) == "regression"
    assert infer_dataset_type(load_molecule_table(FIXTURE_DIR / "smiles_cls.csv").targets) == "classification"


def test_parquet_and_column_selection(tmp_path):
    frame = pd.DataFrame({"id": ["a", "b"], "smi": ["CCO", "c1ccccc1"], "y": [1.5, None], "z": [0.0, 2.0]})
    path = tmp_path / "d.parquet"
    frame.to_parquet(path)
    table = load_molecule_table(path, smiles_column="smi", target_columns=["y"], keep_columns=["id"])
    assert table.smiles == ["CCO", "c1ccccc1"] and table.target_names == ["y"]
    assert table.targets[0, 0] == 1.5 and np.isnan(table.targets[1, 0])
    assert table.extra_columns == {"id": ["a", "b"]}


def test_non_numeric_label_names_the_line_an_editor_shows_and_the_column(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("smiles,y\nCCO,1.0\nCCN,active\n")  # 'active' is on line 3: the header is line 1
    with pytest.raises(ValueError, match=r"bad.csv: line 3, column 'y': label 'active' is not a number"):
        load_molecule_table(path)
    pd.DataFrame({"smiles": ["CCO", "CCN"], "y": ["1.0", "active"]}).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad.parquet: data row 1 \(counted from 0\), column 'y': label 'active'"):
        load_molecule_table(tmp_path / "bad.parquet")


def test_a_data_row_is_named_by_its_line_in_a_csv_and_by_its_index_elsewhere():
    assert [row_place("d.csv", 0), row_place("d.csv.gz", 9)] == ["line 2", "line 11"]
    assert row_place("d.parquet", 0) == row_place("d.smi", 0) == "data row 0 (counted from 0)"


def test_missing_column_suggests_closest(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("smiles,logp\nCCO,1.0\n")
    with pytest.raises(ValueError, match=r"no column 'log_p' \(did you mean 'logp'\?\)"):
        load_molecule_table(path, target_columns=["log_p"])


def test_classification_labels_must_be_binary():
    targets = np.array([[0.0, 1.0], [np.nan, 2.0]])
    with pytest.raises(ValueError, match=r"x.csv: line 3, column 'b': label 2 is not 0 or 1"):
        check_classification_labels("x.csv", targets, ["a", "b"])
