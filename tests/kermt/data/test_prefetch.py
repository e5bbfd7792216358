"""kermt.data.prefetch: batches built ahead by a thread, in order, errors passed on; results read behind."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kermt.data.prefetch import prefetch, read_behind, transfer, transfer_fields
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


@dataclasses.dataclass(frozen=True)
class _Part:
    """A batch part as the batch types hold them: it says where it was asked to go."""

    where: str = "host"

    def pin_memory(self) -> "_Part":
        return _Part("pinned")

    def to(self, device, non_blocking: bool = False) -> "_Part":
        return _Part(f"{device}, non_blocking={non_blocking}")


@dataclasses.dataclass(frozen=True)
class _Batch:
    part: _Part
    tensor: torch.Tensor
    missing: torch.Tensor | None
    kept: str


def test_transfer_fields_pins_or_moves_each_named_part_and_keeps_the_rest():
    batch = _Batch(_Part(), torch.arange(3), None, "rows")
    names = ("part", "tensor", "missing")
    pinned = transfer_fields(batch, ("part", "missing"), None, False)  # a CPU build of torch cannot pin a tensor
    assert pinned.part.where == "pinned" and pinned.missing is None and pinned.tensor is batch.tensor
    moved = transfer_fields(dataclasses.replace(batch, tensor=torch.arange(3.0)), names, "meta", True)
    assert moved.part.where == "meta, non_blocking=True"
    assert moved.tensor.device.type == "meta" and moved.missing is None and moved.kept == "rows"
    assert transfer(None, "meta", False) is None
