"""The one "did you mean" hint: the closest valid name, or nothing when none is close; a level given as a
percentage names the fraction."""

from __future__ import annotations

import pytest

from kermt.errors import UserError
from kermt.names import did_you_mean, level_not_percentage


def test_the_hint_names_the_closest_valid_name_or_nothing():
    assert did_you_mean("batchsize", ["batch_size", "epochs"]) == " (did you mean 'batch_size'?)"
    assert did_you_mean("xyz", ["batch_size", "epochs"]) == ""
    assert did_you_mean("smile", (c for c in ["smiles", 3])) == " (did you mean 'smiles'?)"  # any column names


def test_a_level_given_as_a_percentage_names_the_fraction():
    fraction = r"is a percentage, but a level is a fraction in \(0, 1\): did you mean 0.9\?$"
    with pytest.raises(UserError, match=rf"^90 {fraction}"):
        level_not_percentage(90)
    with pytest.raises(UserError, match=rf"^90 {fraction}"):
        level_not_percentage("90")  # quoted in a YAML file
    with pytest.raises(UserError, match=r"^interval=99.5 is a percentage.*did you mean 0.995\?$"):
        level_not_percentage(99.5, "interval=")
    assert [level_not_percentage(v) for v in (0.9, 0, 1, 1.5, 100, None, "x")] == [0.9, 0, 1, 1.5, 100, None, "x"]
