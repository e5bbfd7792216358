"""A plain ``torch.distributed`` gloo group for tests that spawn their own ranks (no Ray)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int) -> Iterator[None]:
    """Join a ``world``-rank gloo group on 127.0.0.1:``port`` and leave it together with the other ranks.

    The closing barrier matters: a rank that tears its group down while a peer is still in a collective (rank 0
    saving its result, rank 1 already leaving) can make gloo's pair threads abort the peer with SIGABRT
    ('terminate called without an active exception'), failing a test whose numbers were right."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()
