"""Batches to the device ahead of the step: built in a background thread, pinned, copied without waiting.

Every runner (finetune and pretraining workers, the screening actors) feeds its device through :func:`prefetch`,
so the host work of a batch (collating, building the neighbour-sum operators: numpy on the CPU) overlaps the
device's work on the previous one instead of idling it. Prediction loops also read each batch's results back only
after launching the next batch (:func:`read_behind`), so the device has work queued while the host waits for it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Protocol, TypeVar

import torch


class Transferable(Protocol):
    """A batch type (MoleculeBatch, StepBatch, ...): a copy in page-locked memory, and a copy on a device."""

    def pin_memory(self) -> "Transferable": ...

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Transferable": ...


Batch = TypeVar("Batch", bound=Transferable)
T = TypeVar("T")
Launched = TypeVar("Launched")
Read = TypeVar("Read")

_END = object()


def transfer(value, device: torch.device | str | None, non_blocking: bool):
    """``value`` (a tensor, a batch part with its own ``to``/``pin_memory``, or None) on ``device``, or in pinned
    host memory when ``device`` is None: what every batch type's ``to`` and ``pin_memory`` do with their parts."""
    if value is None:
        return None
    return value.pin_memory() if device is None else value.to(device, non_blocking=non_blocking)


def transfer_fields(batch: T, names: tuple[str, ...], device: torch.device | str | None, non_blocking: bool) -> T:
    """``batch`` (a frozen dataclass) with its fields ``names`` transferred (:func:`transfer`), the others kept."""
    return replace(batch, **{name: transfer(getattr(batch, name), device, non_blocking) for name in names})


def prefetch(batches: Iterable[Batch], device: torch.device | str, ahead: int = 2) -> Iterator[Batch]:
    """``batches`` on ``device``, in order, the next ``ahead`` of them built by a background thread meanwhile.

    Iterating ``batches`` happens in the thread, so it overlaps the caller's step. For a CUDA device each batch is
    also pinned there, and its copy is issued with ``non_blocking=True``: the host queues it behind the running
    kernels instead of waiting for them (the copy itself, a few MB, takes the device well under a millisecond, so
    it stays on the current stream). ``batches`` must not share state with the caller's step (a seeded generator
    of its own is fine). Leaving the loop early stops the thread.
    """
    device = torch.device(device)
    pin = device.type == "cuda"
    ready: queue.Queue = queue.Queue(maxsize=max(ahead, 1))
    stop = threading.Event()

    def offer(item) -> bool:
        """Queue ``item`` unless the caller has stopped iterating; False once it has."""
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not offer(batch.pin_memory() if pin else batch):
                    return
            offer(_END)
        except BaseException as error:  # any: re-raised in the caller's thread
            offer(error)

    worker = threading.Thread(target=produce, name="kermt-prefetch", daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item.to(device, non_blocking=pin)
    finally:
        stop.set()
        worker.join()


def read_behind(launched: Iterable[Launched], read: Callable[[Launched], Read]) -> Iterator[Read]:
    """``read(item)`` for every item of ``launched`` (a lazy iterable whose every step launches device work, e.g.
    a forward), in order, each read only after the next item has been launched."""
    pending: list[Launched] = []
    for item in launched:
        if pending:
            yield read(pending.pop())
        pending.append(item)
    if pending:
        yield read(pending.pop())


__all__ = ["Transferable", "prefetch", "read_behind", "transfer", "transfer_fields"]
