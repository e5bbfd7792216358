"""What a training loop needs of the group it runs in: its rank, the group's size, and the collectives.

The loops in :mod:`kermt.train.loop` take a :class:`Communicator` instead of asking a runner for these, so the same
loop runs in one process (:class:`SingleProcess`: a notebook, a test), on plain ``torch.distributed`` processes
(:class:`TorchDistributed`: e.g. gloo processes started by ``torch.multiprocessing``) and on Ray Train's workers
(``ray_app.common.worker_loop`` builds a :class:`TorchDistributed` from Ray Train's context). On one process every
collective is the identity, so a one-worker run does exactly what a single process does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn


class Communicator(Protocol):
    """A rank's view of its group. ``all_reduce`` sums in place over the ranks and returns the tensor;
    ``all_gather`` returns every rank's (picklable) object, by rank; ``wrap`` readies a model so that its gradients
    are averaged over the ranks (DDP), or returns it as it is on one process."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def all_gather(self, obj: Any) -> list[Any]: ...

    def barrier(self) -> None: ...

    def wrap(self, model: nn.Module) -> nn.Module: ...


@dataclass(frozen=True)
class SingleProcess:
    """The whole group is this process: every collective is the identity."""

    rank: int = 0
    world_size: int = 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        pass

    def wrap(self, model: nn.Module) -> nn.Module:
        return model


@dataclass(frozen=True)
class TorchDistributed:
    """A rank of an initialised ``torch.distributed`` default process group (any backend). With one rank the
    collectives are skipped, as on :class:`SingleProcess` (Ray Train may not initialise a group of one)."""

    rank: int
    world_size: int

    @classmethod
    def current(cls) -> TorchDistributed:
        """This process's place in the initialised default group."""
        if not dist.is_initialized():
            raise RuntimeError("TorchDistributed needs an initialised process group (torch.distributed."
                               "init_process_group); use SingleProcess in one process")
        return cls(dist.get_rank(), dist.get_world_size())

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(tensor)
        return tensor

    def all_gather(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return model
        device = next(model.parameters()).device
        device_ids = [device] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


__all__ = ["Communicator", "SingleProcess", "TorchDistributed"]
