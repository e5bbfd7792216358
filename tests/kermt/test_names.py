"""The one "did you mean" hint: the closest valid name, or nothing when none is close."""

from __future__ import annotations

from kermt.names import did_you_mean


def test_the_hint_names_the_closest_valid_name_or_nothing():
    assert did_you_mean("batchsize", ["batch_size", "epochs"]) == " (did you mean 'batch_size'?)"
    assert did_you_mean("xyz", ["batch_size", "epochs"]) == ""
    assert did_you_mean("smile", (c for c in ["smiles", 3])) == " (did you mean 'smiles'?)"  # any column names
