"""explored.csv grows by appending a round: byte for byte the file a whole rewrite of the same rows makes, readers
see only whole rounds (also after a stop mid-append, which the next append cuts away), in bounded memory."""

from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
import pytest

from kermt.errors import UserError
from kermt.explore.explored import Explored, append_round, read_explored, record_path, write_explored

NAN = math.nan


def _round(round_index: int, n: int, first_row: int = 0) -> Explored:
    rows = np.arange(first_row, first_row + n)
    acquired = np.full(n, NAN) if round_index == 0 else rows * 0.5
    errors = ["timed out after 60 s" if i % 7 == 3 else "" for i in range(n)]
    errors[-1] = 'said "no"\nthen stopped' if n > 1 else ""  # a quoted newline: one row over two lines
    return Explored([f"C{'C' * (i % 5)}O,{i}" for i in rows], np.where(rows % 7 == 3, NAN, rows * 0.25),
                    np.full(n, round_index), acquired, acquired / 4, acquired + 1, rows, errors)


def _rounds(count: int, n: int = 5) -> list[Explored]:
    return [_round(k, n, first_row=10 * k) for k in range(count)]


def _whole(rounds: list[Explored]) -> Explored:
    whole = Explored()
    for batch in rounds:
        whole = whole.extended(batch)
    return whole


def _files(tmp_path, *runs: str) -> list:
    """explored.csv of each run, in folders of their own (a file's record is beside it)."""
    for run in runs:
        (tmp_path / run).mkdir()
    return [tmp_path / run / "explored.csv" for run in runs]


def _append_all(path, rounds: list[Explored]) -> None:
    for batch in rounds:
        append_round(str(path), batch)


def test_appending_rounds_makes_the_file_a_whole_rewrite_makes(tmp_path):
    appended, whole = _files(tmp_path, "appended", "whole")
    rounds = _rounds(4)
    _append_all(appended, rounds)
    write_explored(str(whole), _whole(rounds))
    assert appended.read_bytes() == whole.read_bytes()
    assert json.loads(record_path(str(appended)).read_text()) == {"bytes": whole.stat().st_size, "rows": 20,
                                                                  "rounds": 4}
    back = read_explored(str(appended))
    assert back.rounds_done == 4 and back.smiles == _whole(rounds).smiles
    assert back.error[4] == 'said "no"\nthen stopped'
    np.testing.assert_array_equal(back.score, _whole(rounds).score)


def test_a_round_stopped_mid_append_is_never_read_and_the_next_append_cuts_it(tmp_path):
    stopped, straight = _files(tmp_path, "stopped", "straight")
    rounds = _rounds(3)
    _append_all(straight, rounds)
    _append_all(stopped, rounds[:2])
    two_rounds = stopped.read_bytes()
    # the stop: round 2's rows partly on disk (cut mid-row), its record never written
    round_2 = straight.read_bytes()[len(two_rounds):]
    with open(stopped, "ab") as out:
        out.write(round_2[:len(round_2) * 2 // 3])
    assert len(stopped.read_bytes()) > len(two_rounds)
    resumed = read_explored(str(stopped))
    assert resumed.rounds_done == 2 and len(resumed) == 10
    assert resumed.smiles == _whole(rounds[:2]).smiles
    append_round(str(stopped), rounds[2])  # the resumed run acquires round 2 again, the same rows
    assert stopped.read_bytes() == straight.read_bytes()
    assert read_explored(str(stopped)).rounds_done == 3


def test_a_first_round_stopped_mid_append_leaves_no_rows(tmp_path):
    stopped, straight = _files(tmp_path, "stopped", "straight")
    append_round(str(straight), _round(0, 5))
    append_round(str(stopped), Explored())  # the file and its record made, no rows yet: as a stop would find it
    with open(stopped, "ab") as out:
        out.write(straight.read_bytes()[len(stopped.read_bytes()):][:40])
    assert len(read_explored(str(stopped))) == 0
    append_round(str(stopped), _round(0, 5))
    assert stopped.read_bytes() == straight.read_bytes()


def test_a_file_without_its_record_is_read_whole_and_appended_to(tmp_path):
    path = tmp_path / "explored.csv"
    rounds = _rounds(3)
    write_explored(str(path), _whole(rounds[:2]))
    record_path(str(path)).unlink()  # a file written before records existed
    assert read_explored(str(path)).rounds_done == 2
    append_round(str(path), rounds[2])
    (tmp_path / "whole").mkdir()
    write_explored(str(tmp_path / "whole" / "explored.csv"), _whole(rounds))
    assert path.read_bytes() == (tmp_path / "whole" / "explored.csv").read_bytes()


def test_cutting_back_with_a_whole_rewrite_keeps_file_and_record_together(tmp_path):
    path = tmp_path / "explored.csv"
    rounds = _rounds(3)
    _append_all(path, rounds)
    with open(path, "ab") as out:
        out.write(b"CCN,,3,")  # a stopped round's rows
    write_explored(str(path), read_explored(str(path)).before_round(1))
    assert read_explored(str(path)).rounds_done == 1
    assert json.loads(record_path(str(path)).read_text())["rows"] == 5


def test_a_file_shorter_than_its_record_is_one_line(tmp_path):
    path = tmp_path / "explored.csv"
    append_round(str(path), _round(0, 5))
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(UserError, match="changed by hand"):
        read_explored(str(path))
    with pytest.raises(UserError, match="changed by hand"):
        append_round(str(path), _round(1, 5, first_row=10))


def test_a_large_round_is_appended_in_bounded_memory(tmp_path):
    path = tmp_path / "explored.csv"
    append_round(str(path), _round(0, 10))
    batch = _round(1, 100_000, first_row=10)
    tracemalloc.start()
    try:
        append_round(str(path), batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = path.stat().st_size
    assert size > 5_000_000  # ~60 bytes a row
    assert peak < size / 10, (peak, size)  # a chunk of rows and the file's buffer, not the round's text
    assert json.loads(record_path(str(path)).read_text()) == {"bytes": size, "rows": 100_010, "rounds": 2}
