"""--objective's three forms, parsed, and one-line errors for anything else."""

from __future__ import annotations

import pytest

from kermt.errors import UserError
from kermt.explore.objective_spec import parse_objective


@pytest.mark.parametrize("text, path, column", [
    ("lookup:scores.csv", "scores.csv", None),
    ("lookup:data/scores.csv.gz:logp", "data/scores.csv.gz", "logp"),
    ("lookup:s3://bucket/scores.csv", "s3://bucket/scores.csv", None),
    ("lookup:s3://bucket/scores.csv:score", "s3://bucket/scores.csv", "score"),
    ("lookup:/abs/a:b/scores.csv", "/abs/a:b/scores.csv", None),
])
def test_lookup_names_a_file_and_maybe_its_column(text, path, column):
    spec = parse_objective(text)
    assert (spec.kind, spec.path, spec.column) == ("lookup", path, column)


def test_command_keeps_the_programs_own_words():
    spec = parse_objective("command:./dock.sh --box 'site 1.pdb'")
    assert (spec.kind, spec.program) == ("command", ("./dock.sh", "--box", "site 1.pdb"))


def test_python_names_a_module_and_a_function():
    spec = parse_objective("python:my_pkg.scores:logp")
    assert (spec.kind, spec.module, spec.function) == ("python", "my_pkg.scores", "logp")


@pytest.mark.parametrize("text, message", [
    ("scores.csv", r"^--objective 'scores.csv': expected lookup:FILE\[:COLUMN\], command:PROGRAM or "
                   r"python:MODULE:FUNCTION$"),
    ("dock:x.sh", "expected lookup:FILE"),
    ("lookup:", "nothing after lookup:"),
    ("lookup:scores.csv:", "empty COLUMN"),
    ("python:logp", r"expected python:MODULE:FUNCTION \(e.g. python:my_scores:logp\)$"),
    ("python:mod:not-a-name", "expected python:MODULE:FUNCTION"),
    ("command:./dock.sh 'unclosed", "cannot split the command into words"),
])
def test_anything_else_is_one_line(text, message):
    with pytest.raises(UserError, match=message):
        parse_objective(text)
