"""What every GPU-lane test shares: the skip without CUDA and float32 matmuls without TF32 for parity."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

# Applied per module (``pytestmark``): the lane is opt-in (-m gpu) and skips, with the reason, on a CPU machine.
GPU_LANE = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device (torch.cuda.is_available() is False): run on a GPU machine"),
]


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """Matmuls (and cuDNN) with or without TF32 inside the block, as they were afterwards. Parity runs without it:
    TF32 keeps 10 mantissa bits, so a matmul's result moves by ~1e-3 of its size, far beyond the 1e-5 of parity."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def max_distance(actual: torch.Tensor, expected) -> float:
    """max |actual - expected| (expected: a tensor or a numpy array), computed on the host in float64."""
    expected = torch.as_tensor(expected, dtype=torch.float64)
    return float((actual.detach().cpu().double() - expected).abs().max())
