"""Tensors put once in the object store come back exactly, as views of one shared copy."""

from __future__ import annotations

import torch

from ray_app.common.shared_tensors import get_tensors, put_tensors


def test_every_dtype_and_shape_comes_back_exactly_and_zero_copy(ray_cluster):
    torch.manual_seed(0)
    tensors = {"w": torch.randn(3, 5), "bf16": torch.randn(4, 2).to(torch.bfloat16), "scalar": torch.tensor(2.5),
               "ids": torch.arange(7, dtype=torch.int64), "mask": torch.tensor([True, False, True]),
               "empty": torch.zeros(0, 4), "strided": torch.randn(6, 4).t()}
    ref = put_tensors(tensors)
    first, second = get_tensors(ref), get_tensors(ref)
    assert first.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert first[name].dtype == tensor.dtype and first[name].shape == tensor.shape, name
        assert torch.equal(first[name], tensor), name
    # both reads are views of the object store's one copy, not private copies
    assert first["w"].data_ptr() == second["w"].data_ptr()
