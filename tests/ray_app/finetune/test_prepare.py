"""Reading a run's input files: labels, invalid rows with their row numbers, blinded test sets."""

from __future__ import annotations

import numpy as np
import pytest

from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.prepare import load_source

SMILES = ["CCO", "c1ccccc1O", "not_a_smiles", "CC(=O)O"]


def _write(path, header, rows):
    path.write_text("\n".join([",".join(header)] + [",".join(r) for r in rows]) + "\n")
    return str(path)


def test_labelled_file_keeps_valid_rows_and_lists_invalid_ones(ray_cluster, tmp_path):
    path = _write(tmp_path / "train.csv", ["smiles", "y"], [[s, str(i)] for i, s in enumerate(SMILES)])
    source = load_source(path, FinetuneConfig(data_path=path), None, None)
    assert source.target_names == ["y"] and source.rows.tolist() == [0, 1, 3]
    np.testing.assert_array_equal(source.targets[:, 0], [0.0, 1.0, 3.0])
    assert [(bad.row, bad.smiles) for bad in source.invalid] == [(2, "not_a_smiles")]


def test_on_invalid_error_names_each_bad_row_by_the_line_an_editor_shows(ray_cluster, tmp_path):
    path = _write(tmp_path / "train.csv", ["smiles", "y"], [[s, str(i)] for i, s in enumerate(SMILES)])
    with pytest.raises(ValueError, match=r"train.csv: 1 invalid SMILES \(--on_invalid error\): line 4: unparsable"):
        load_source(path, FinetuneConfig(data_path=path, on_invalid="error"), None, None)  # data row 2


def test_blinded_test_file_gets_nan_labels(ray_cluster, tmp_path):
    path = _write(tmp_path / "test.csv", ["smiles"], [[s] for s in SMILES])
    source = load_source(path, FinetuneConfig(data_path=path), ["y1", "y2"], None, blinded_ok=True)
    assert source.target_names == ["y1", "y2"] and source.targets.shape == (3, 2)
    assert np.isnan(source.targets).all()


def test_partially_labelled_test_file_is_an_error_naming_the_column(ray_cluster, tmp_path):
    path = _write(tmp_path / "test.csv", ["smiles", "y1"], [[s, "1"] for s in SMILES])
    with pytest.raises(ValueError, match="no column 'y2'"):
        load_source(path, FinetuneConfig(data_path=path), ["y1", "y2"], None, blinded_ok=True)
