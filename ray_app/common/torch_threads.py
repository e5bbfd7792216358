"""torch's intra-op thread count for a block of work in this process.

Why a process that is not a Ray worker sets it: torch's default is one thread per core, and OpenMP's threads spin
while they wait, so beside other work on the same cores (Ray's workers, other users) they cost far more than they
give: a 2,000-molecule prediction ran 2-7x slower on two threads than on one (bench/predict.py), and kermt
finetune's driver predictions took ~10x the CPU (bench/finetune_wall.py, docs/finetuning.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` for the block, as they were after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["torch_threads"]
