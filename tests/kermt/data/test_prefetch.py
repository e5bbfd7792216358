"""kermt.data.prefetch: batches built ahead by a thread, in order, errors passed on; results read behind."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kermt.data.prefetch import prefetch, read_behind
from tests.kermt.data.test_dataset import _molecule_set


def test_prefetch_yields_the_batches_in_order_and_passes_errors_on():
    molecules = _molecule_set()
    plan = [np.array([0, 1]), np.array([2]), np.array([3, 0])]
    got = list(prefetch((molecules.batch(rows) for rows in plan), "cpu", ahead=1))
    assert [batch.rows.tolist() for batch in got] == [rows.tolist() for rows in plan]
    for batch, rows in zip(got, plan):
        assert torch.equal(batch.graph.f_atoms, molecules.batch(rows).graph.f_atoms)

    def failing():
        yield molecules.batch(plan[0])
        raise ValueError("row 7 is broken")

    with pytest.raises(ValueError, match="row 7"):
        list(prefetch(failing(), "cpu"))
    first = next(iter(prefetch((molecules.batch(rows) for rows in plan * 10), "cpu", ahead=1)))
    assert first.rows.tolist() == [0, 1]  # the abandoned iterator's thread stops (the generator closes it)


def test_read_behind_reads_each_item_after_the_next_is_launched():
    events = []

    def launched():
        for i in range(3):
            events.append(f"launch {i}")
            yield i

    def read(i):
        events.append(f"read {i}")
        return 10 * i

    assert list(read_behind(launched(), read)) == [0, 10, 20]
    assert events == ["launch 0", "launch 1", "read 0", "launch 2", "read 1", "read 2"]
    assert list(read_behind(iter(()), read)) == []
