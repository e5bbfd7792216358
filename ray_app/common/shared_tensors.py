"""Tensors that many processes of a node read from one copy in Ray's object store.

Ray hands numpy arrays back zero-copy (read-only views of the node's shared memory) but deserialises a torch tensor
into a private copy. A run's source checkpoint (280 MB of weights for the 70M release) is therefore put once as
raw bytes per tensor and viewed back as tensors: every member coordinator, trial and worker on a node then reads
the same pages instead of holding a copy each. Bytes rather than typed arrays so that every dtype (bfloat16, which
numpy lacks, included) makes the round trip exactly.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import ray
import torch


@dataclass(frozen=True)
class _Stored:
    data: np.ndarray  # uint8, the tensor's bytes
    dtype: torch.dtype
    shape: tuple[int, ...]


def put_tensors(tensors: dict[str, torch.Tensor]) -> ray.ObjectRef:
    """One object holding every tensor's bytes; read it back with :func:`get_tensors`."""
    stored = {name: _Stored(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy(), t.dtype,
                            tuple(t.shape)) for name, t in tensors.items()}
    return ray.put(stored)


def get_tensors(ref: ray.ObjectRef) -> dict[str, torch.Tensor]:
    """The tensors :func:`put_tensors` stored, as read-only views of the object store's copy (load them into a
    model, or copy them, before writing to them)."""
    stored: dict[str, _Stored] = ray.get(ref)
    with warnings.catch_warnings():  # the views are read-only on purpose; torch warns that it cannot enforce that
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {name: torch.from_numpy(s.data).view(s.dtype).reshape(s.shape) for name, s in stored.items()}
