"""Requests for one model gathered into calls while the model's calls are busy: the ingress's side of batching.

Every call from the ingress to a model replica costs Serve's request path on both sides (the deployment handle,
the router, the replica's own bookkeeping: a few ms of CPU each), the same for one molecule as for a hundred.
A :class:`Coalescer` keeps at most ``max_calls`` calls to its model in flight. A request that finds a free call
slot goes at once, alone (a client sending one SMILES at a time waits for nobody); requests that arrive while
every slot is busy wait together and leave as one call when a slot frees. The busier the model, the larger its
calls: batches grow with the load and never wait on a timer.

``@serve.batch`` cannot do this: it closes a batch when its timer runs out, before it waits for a free slot
(``max_concurrent_batches``), so a busy deployment queues many small batches instead of growing one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    """Sends items through ``send`` (one call: a sequence of items in, one result per item out, in order) with at
    most ``max_calls`` calls in flight and at most ``max_items`` items per call. Made and used on one event loop."""

    def __init__(self, send: Callable[[Sequence[Item]], Awaitable[Sequence[Result]]], max_calls: int,
                 max_items: int):
        if max_calls < 1 or max_items < 1:
            raise ValueError(f"max_calls ({max_calls}) and max_items ({max_items}) must be at least 1")
        self._send, self._max_items = send, max_items
        self._free_calls = max_calls
        self._waiting: list[tuple[Item, asyncio.Future]] = []
        self._calls: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    async def submit(self, item: Item) -> Result:
        """``item``'s result (or the exception its call raised)."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._dispatch()
        return await future

    def _dispatch(self) -> None:
        while self._free_calls and self._waiting:
            group, self._waiting = self._waiting[: self._max_items], self._waiting[self._max_items :]
            self._free_calls -= 1
            call = asyncio.create_task(self._call(group))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(self, group: list[tuple[Item, asyncio.Future]]) -> None:
        try:
            results = await self._send([item for item, _ in group])
            if len(results) != len(group):
                raise RuntimeError(f"a call of {len(group)} items returned {len(results)} results")
            for (_, future), result in zip(group, results):
                if not future.done():  # a client that went away cancelled its own
                    future.set_result(result)
        except Exception as error:  # every request of the call gets it: none waits forever
            for _, future in group:
                if not future.done():
                    future.set_exception(error)
        finally:
            self._free_calls += 1
            self._dispatch()


__all__ = ["Coalescer"]
