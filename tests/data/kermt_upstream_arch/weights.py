"""The weights of the architecture oracle's models, regenerated from (case, key, shape) instead of stored.

record.py loads them into upstream's models; tests/kermt/nn/test_arch_parity.py writes the same tensors into an
upstream-format checkpoint. Imports torch only, so upstream's process (whose package is also called ``kermt``) can
use it. Every value is a multiple of 1/64, so float32 holds it exactly whatever computes it.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import OrderedDict

import torch

CODE_SCALE = 64.0
MAX_CODE = 127
ONE_D_STD = 0.3  # biases, LayerNorm gains and PReLU slopes: far from upstream's init (0) and torch's (1, 0.25)


def keyed_weight(case: str, key: str, shape: list[int]) -> torch.Tensor:
    """N(0, std²) from a generator seeded with crc32 of ``"{case}:{key}"``, rounded to a multiple of 1/CODE_SCALE.
    ``std``: ONE_D_STD for 1-D tensors, xavier-normal's ``sqrt(2 / (fan_in + fan_out))`` for matrices."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{case}:{key}".encode()))
    std = ONE_D_STD if len(shape) == 1 else (2.0 / (shape[0] + shape[1])) ** 0.5
    codes = torch.round(torch.randn(shape, generator=generator) * std * CODE_SCALE).clamp(-MAX_CODE, MAX_CODE)
    return codes / CODE_SCALE


def state_dict(case: str, layout: list[list]) -> OrderedDict[str, torch.Tensor]:
    """A state dict from ``layout`` rows ``[key, shape, source]``: the keyed weight of ``source`` (the first key of
    the same tensor: upstream lists a shared PReLU under several keys), or zeros when ``source`` is None (a buffer)."""
    state: OrderedDict[str, torch.Tensor] = OrderedDict()
    for key, shape, source in layout:
        if source is None:
            state[key] = torch.zeros(shape)
        elif source == key:
            state[key] = keyed_weight(case, key, shape)
        else:
            state[key] = state[source]
    return state


def digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over keys and float32 bytes, in order: proves the regenerated weights are the ones upstream ran."""
    sha = hashlib.sha256()
    for key, tensor in state.items():
        sha.update(key.encode())
        sha.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    return sha.hexdigest()
