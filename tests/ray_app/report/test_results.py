"""test_result.csv as the run writes it (ray_app.common.outputs), read back for the report."""

from __future__ import annotations

import numpy as np
import pytest

from kermt.errors import UserError
from ray_app.common import outputs
from ray_app.report.results import read_spread, read_test_result

SMILES = ["CCO", "c1ccccc1", "CC(=O)O"]
PREDS = np.array([[0.1, 1.5], [0.2, np.nan], [0.3, 2.5]])
TARGETS = np.array([[0.0, np.nan], [1.0, 2.0], [np.nan, 3.0]])


def test_two_header_layout_round_trips(tmp_path):
    path = tmp_path / "test_result.csv"
    path.write_text(outputs.test_result_csv(SMILES, ["a", "b"], PREDS, TARGETS))
    result = read_test_result(path)
    assert result.smiles == SMILES and result.tasks == ["a", "b"]
    np.testing.assert_array_equal(result.preds, PREDS)
    np.testing.assert_array_equal(result.targets, TARGETS)


def test_blinded_file_and_spread(tmp_path):
    path = tmp_path / "test_spread.csv"
    path.write_text(outputs.test_result_csv(SMILES, ["a", "b"], PREDS, None))
    assert read_test_result(path).targets is None
    spread, distance = read_spread(path, ["a", "b"])
    np.testing.assert_array_equal(spread, PREDS)
    assert distance is None
    assert read_spread(path, ["a"]) == (None, None) == read_spread(tmp_path / "missing.csv", ["a", "b"])
    # a mondrian_domain run writes each test molecule's domain_distance after the tasks
    distances = np.arange(len(SMILES), dtype=np.float64) + 0.5
    path.write_text(outputs.test_result_csv(SMILES, ["a", "b", "domain_distance"],
                                            np.column_stack([PREDS, distances]), None))
    spread, distance = read_spread(path, ["a", "b"])
    np.testing.assert_array_equal(spread, PREDS)
    np.testing.assert_array_equal(distance, distances)


def test_a_run_without_a_test_split_reads_as_no_molecules(tmp_path):
    """kermt explore's surrogates hold no test split: the run writes the header rows only (its report failed)."""
    for targets in (TARGETS, None):
        path = tmp_path / "test_result.csv"
        path.write_text(outputs.test_result_csv([], ["a", "b"], PREDS[:0], None if targets is None else targets[:0]))
        result = read_test_result(path)
        assert result.smiles == [] and result.tasks == ["a", "b"] and result.preds.shape == (0, 2)
        assert (result.targets is None) == (targets is None)


def test_a_cell_that_is_not_a_number_names_the_file(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(",a\nCCO,high\n")
    with pytest.raises(UserError, match="bad.csv: a cell is not a number"):
        read_test_result(path)


def test_a_labelled_input_file_is_refused_in_one_line_saying_what_report_reads(tmp_path, capsys):
    """A training file (smiles + measured columns) is not a scored file: without this it read as a blinded one, and
    `kermt report` exited 0 with a page saying the file had no measured values."""
    from ray_app.cli import main

    path = tmp_path / "train.csv"
    path.write_text("smiles,logp,tpsa\nCCO,-0.1,20.2\nc1ccccc1,1.7,0.0\n")
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"kermt report: error: {path}: its first column is named 'smiles', so it reads as an input "
                   "file, not a scored one (kermt eval and upstream leave that header cell blank); kermt report reads "
                   "what kermt eval or kermt predict wrote, or a run's --save_dir: to score this file, kermt eval "
                   f"--data_path {path} --checkpoint_path MODEL --output_path scored.csv\n")
    assert not (tmp_path / "train_report.html").exists()
