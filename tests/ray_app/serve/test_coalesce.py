"""The ingress's coalescing of requests into model calls (real asyncio, a model call stood in for by a coroutine
that records what it was sent and waits until the test lets it answer)."""

from __future__ import annotations

import asyncio

import pytest

from ray_app.serve.coalesce import Coalescer


class Model:
    """Records each call's items; every call waits for :meth:`answer` (all calls so far answer at once)."""

    def __init__(self, fail_on: str | None = None, drop_one: bool = False):
        self.calls: list[list[str]] = []
        self.fail_on, self.drop_one = fail_on, drop_one
        self._answer = asyncio.Event()

    async def send(self, items):
        self.calls.append(list(items))
        await self._answer.wait()
        if self.fail_on in items:
            raise ValueError(f"bad item {self.fail_on}")
        results = [item.upper() for item in items]
        return results[:-1] if self.drop_one else results

    def answer(self) -> None:
        self._answer.set()
        self._answer = asyncio.Event()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_requests_that_wait_for_a_busy_model_leave_together_and_get_their_own_results():
    async def scenario():
        model = Model()
        coalescer = Coalescer(model.send, max_calls=1, max_items=10)
        first = asyncio.create_task(coalescer.submit("a"))
        await _settle()
        assert model.calls == [["a"]]  # alone: sent at once, no timer
        rest = [asyncio.create_task(coalescer.submit(item)) for item in "bcde"]
        await _settle()
        assert model.calls == [["a"]]  # the one call slot is busy: they wait
        model.answer()
        assert await first == "A"
        await _settle()
        assert model.calls == [["a"], ["b", "c", "d", "e"]]  # one call for the four
        model.answer()
        assert await asyncio.gather(*rest) == ["B", "C", "D", "E"]

    asyncio.run(scenario())


def test_calls_in_flight_and_items_per_call_are_bounded():
    async def scenario():
        model = Model()
        coalescer = Coalescer(model.send, max_calls=2, max_items=3)
        tasks = [asyncio.create_task(coalescer.submit(str(i))) for i in range(9)]
        await _settle()
        assert model.calls == [["0"], ["1"]]  # each found a free slot; the other seven wait
        model.answer()
        await _settle()
        assert model.calls[2:] == [["2", "3", "4"], ["5", "6", "7"]]
        model.answer()
        await _settle()
        assert model.calls[4:] == [["8"]]
        model.answer()
        assert await asyncio.gather(*tasks) == [str(i) for i in range(9)]

    asyncio.run(scenario())


def test_a_failed_call_fails_its_own_requests_only_and_frees_its_slot():
    async def scenario():
        model = Model(fail_on="bad")
        coalescer = Coalescer(model.send, max_calls=1, max_items=10)
        busy = asyncio.create_task(coalescer.submit("ok"))
        await _settle()
        doomed = [asyncio.create_task(coalescer.submit(item)) for item in ("x", "bad")]
        await _settle()
        model.answer()
        assert await busy == "OK"
        await _settle()
        model.answer()
        for task in doomed:
            with pytest.raises(ValueError, match="bad item bad"):
                await task
        later = asyncio.create_task(coalescer.submit("y"))
        await _settle()
        model.answer()
        assert await later == "Y"  # the slot came back

    asyncio.run(scenario())


def test_a_call_that_returns_too_few_results_is_an_error_not_a_hang():
    async def scenario():
        model = Model(drop_one=True)
        coalescer = Coalescer(model.send, max_calls=1, max_items=10)
        task = asyncio.create_task(coalescer.submit("a"))
        await _settle()
        model.answer()
        with pytest.raises(RuntimeError, match="1 items returned 0 results"):
            await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_bounds_below_one_are_refused():
    with pytest.raises(ValueError, match="max_calls"):
        Coalescer(Model().send, max_calls=0, max_items=1)
