"""command:PROGRAM scores molecules as Ray tasks; a failing, hanging or silent program is recorded per molecule."""

from __future__ import annotations

import math
import stat

import pytest

from kermt.errors import UserError
from kermt.explore.objective_spec import parse_objective
from ray_app.explore.objectives import make_scorer

SCORER = """#!/bin/sh
# the score is the SMILES' length; a chlorine fails the run, a bromine hangs, an iodine gets no score
echo smiles,score > "$2"
while read -r s; do
  case "$s" in
    *Cl*) echo "cannot dock a chlorine" >&2; exit 3 ;;
    *Br*) sleep 60 ;;
    *I*) ;;
    *) echo "$s,${#s}" >> "$2" ;;
  esac
done < "$1"
"""


@pytest.fixture
def scorer_program(tmp_path):
    path = tmp_path / "dock.sh"
    path.write_text(SCORER)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_each_molecule_gets_its_score_or_its_reason(ray_cluster, scorer_program):
    scorer = make_scorer(parse_objective(f"command:{scorer_program}"), timeout_s=3.0, cpus=1, batch_size=1)
    got = scorer(["CCO", "CCCl", "CCBr", "CCI", "c1ccccc1"])
    assert got.values[0] == 3.0 and got.values[4] == 8.0
    assert all(math.isnan(v) for v in got.values[1:4])
    assert got.errors == ["", "dock.sh exited with status 3: cannot dock a chlorine", "timed out after 3 s",
                          "dock.sh wrote no score for it", ""]


def test_a_batch_shares_its_programs_fate_and_time(ray_cluster, scorer_program):
    scorer = make_scorer(parse_objective(f"command:{scorer_program}"), timeout_s=2.0, cpus=1, batch_size=2)
    got = scorer(["CCO", "CCN", "CCBr", "CC"])
    assert got.values.tolist()[:2] == [3.0, 3.0] and got.errors[2:] == ["timed out after 4 s"] * 2


def test_a_missing_program_is_one_line_before_any_work(tmp_path):
    with pytest.raises(UserError, match=r"dock.sh does not exist"):
        make_scorer(parse_objective(f"command:{tmp_path}/dock.sh"), timeout_s=1.0, cpus=1, batch_size=1)
