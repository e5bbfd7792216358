"""explored.csv round-trips, and the in-process scorers (lookup, python) record failures per molecule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kermt.errors import UserError
from kermt.explore.explored import EXPLORED_COLUMNS, Explored, read_explored, write_explored
from kermt.explore.objective_spec import parse_objective
from kermt.explore.scorers import NOT_IN_LOOKUP, lookup_scorer, python_scorer

NAN = math.nan


def _batch(round_index, smiles, scores, rows, errors=None):
    n = len(smiles)
    predicted = 0.5 if round_index else NAN
    return Explored(list(smiles), np.array(scores, float), np.full(n, round_index), np.full(n, predicted),
                    np.full(n, NAN), np.full(n, 1.25 if round_index else NAN), np.array(rows), errors or [""] * n)


def test_explored_csv_round_trips_whole_rounds(tmp_path):
    explored = _batch(0, ["CCO", "c1ccccc1"], [1.5, NAN], [3, 0], ["", "timed out after 60 s"])
    explored = explored.extended(_batch(1, ["CC,N"], [-0.25], [7]))
    path = tmp_path / "explored.csv"
    write_explored(str(path), explored)
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(EXPLORED_COLUMNS)
    assert lines[2] == "c1ccccc1,,0,,,,0,timed out after 60 s"
    assert lines[3] == '"CC,N",-0.25,1,0.5,,1.25,7,'
    back = read_explored(str(path))
    assert back.smiles == explored.smiles and back.error == explored.error
    np.testing.assert_array_equal(back.score, explored.score)
    np.testing.assert_array_equal(back.library_row, [3, 0, 7])
    assert back.rounds_done == 2 and back.scored.tolist() == [True, False, True]
    assert back.before_round(1).smiles == ["CCO", "c1ccccc1"]


def test_a_file_that_is_not_explored_csv_is_one_line(tmp_path):
    other = tmp_path / "explored.csv"
    other.write_text("smiles,y\nCCO,1\n")
    with pytest.raises(UserError, match="is not an explored.csv of kermt explore"):
        read_explored(str(other))


def test_lookup_scores_by_exact_smiles_and_records_the_missing(tmp_path):
    scores = tmp_path / "scores.csv"
    scores.write_text("SMILES,logp,other\nCCO,-0.1,x\nCCN,,x\nc1ccccc1,1.7,x\nCCO,9.9,x\nCCCl,abc,x\n")
    scorer = lookup_scorer(parse_objective(f"lookup:{scores}"))
    got = scorer(["c1ccccc1", "CCO", "CCN", "CCC", "CCCl"])
    np.testing.assert_array_equal(got.values, [1.7, -0.1, NAN, NAN, NAN])  # the first CCO row
    assert got.errors == ["", "", NOT_IN_LOOKUP, NOT_IN_LOOKUP,
                          "its lookup score is not a number"]
    assert got.failed == 3
    assert lookup_scorer(parse_objective(f"lookup:{scores}:other")).column == "other"
    with pytest.raises(UserError, match=r"has no column 'logP' \(did you mean 'logp'\?\)"):
        lookup_scorer(parse_objective(f"lookup:{scores}:logP"))
    with pytest.raises(UserError, match="the file does not exist"):
        lookup_scorer(parse_objective(f"lookup:{tmp_path / 'none.csv'}"))


def test_python_objective_calls_the_function_and_records_none(tmp_path, monkeypatch):
    (tmp_path / "my_objective.py").write_text("def length(smiles):\n    return [None if 'N' in s else len(s) "
                                              "for s in smiles]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    got = python_scorer(parse_objective("python:my_objective:length"))(["CCO", "CCN"])
    np.testing.assert_array_equal(got.values, [3.0, NAN])
    assert got.errors == ["", "length gave no score"]
    with pytest.raises(UserError, match="my_objective has no function nope"):
        python_scorer(parse_objective("python:my_objective:nope"))
    with pytest.raises(UserError, match="cannot import no_such_module_here"):
        python_scorer(parse_objective("python:no_such_module_here:f"))
