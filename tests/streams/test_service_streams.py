"""Streams through a Service whose stage streams, its model in worker threads:
step-wise and lockstep batching, per-item errors, callers that leave, overload,
deadlines, draining, and the iterator for plain threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from microbatch import (
    BatcherClosed,
    DeadlineExceeded,
    ItemError,
    ItemTooLarge,
    Model,
    Overloaded,
    Service,
    Stage,
    StreamingServable,
)
from microbatch.types import deadline_from

from .models import Counter, Lockstep, Name


def counter_service(**settings: object) -> Service[str, list[str]]:
    stage_settings = {"max_batch_size": 4, **settings}
    return Service(Stage(Counter, mode="thread", **stage_settings))  # type: ignore[arg-type]


async def chunks_of(stream: AsyncIterator[object]) -> list[object]:
    return [chunk async for chunk in stream]


async def test_each_stream_gets_its_own_chunks_in_order() -> None:
    async with counter_service() as service:
        assert isinstance(service, StreamingServable) and service.can_stream()
        names = [f"s{i}:{1 + i % 5}" for i in range(12)]
        results = await asyncio.gather(*(chunks_of(service.stream(name)) for name in names))
    for name, chunks in zip(names, results, strict=True):
        stem, length = name.split(":")
        assert chunks == [f"{stem}-{k}" for k in range(int(length))]
    assert max(len(step) for step in Counter.steps) <= 4


async def test_items_join_and_leave_between_steps() -> None:
    async with counter_service() as service:
        long = service.stream("long:6")
        assert await long.__anext__() == "long-0"
        short = await chunks_of(service.stream("short:2"))  # joins while long runs
        assert short == ["short-0", "short-1"]
        assert await chunks_of(long) == [f"long-{k}" for k in range(1, 6)]
    assert any(step == ["long", "short"] for step in Counter.steps)


async def test_submit_answers_the_list_of_chunks() -> None:
    async with counter_service() as service:
        assert await service.submit("a:3") == ["a-0", "a-1", "a-2"]


async def test_a_failing_item_fails_alone() -> None:
    async with counter_service() as service:
        good = asyncio.gather(*(chunks_of(service.stream(f"g{i}:4")) for i in range(3)))
        bad = service.stream("bad:4:fail@2")
        received = []
        with pytest.raises(ItemError, match="bad failed at step 2"):
            async for chunk in bad:
                received.append(chunk)
        assert received == ["bad-0", "bad-1"]
        assert await good == [[f"g{i}-{k}" for k in range(4)] for i in range(3)]


async def test_a_caller_that_leaves_frees_its_place_at_the_next_step() -> None:
    async with counter_service(max_batch_size=1) as service:
        endless = service.stream("pid")
        await endless.__anext__()
        await endless.aclose()  # type: ignore[attr-defined]
        # with max_active 1, this one can only run once the endless one is gone
        assert await chunks_of(service.stream("next:2")) == ["next-0", "next-1"]
    assert ["pid", "next"] not in Counter.steps


async def test_a_cancelled_reader_leaves_its_stream() -> None:
    async with counter_service(max_batch_size=1) as service:
        endless = service.stream("pid")
        await endless.__anext__()
        reader = asyncio.ensure_future(chunks_of(endless))
        await asyncio.sleep(0.01)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert await chunks_of(service.stream("next:1")) == ["next-0"]
        assert service.stats().in_flight == 0


async def test_overload_is_refused_before_the_stream_starts() -> None:
    Counter.gate = threading.Event()
    async with counter_service(max_batch_size=1, max_queue=1) as service:
        running = service.stream("a:1")  # joins the first step, held at the gate
        await asyncio.sleep(0.05)
        waiting = service.stream("b:1")
        with pytest.raises(Overloaded):
            service.stream("c:1")
        Counter.gate.set()
        assert await chunks_of(running) == ["a-0"]
        assert await chunks_of(waiting) == ["b-0"]


async def test_deadline_before_the_first_chunk() -> None:
    Counter.gate = threading.Event()
    async with counter_service() as service:
        stream = service.stream("slow:3", first_chunk_deadline=deadline_from(0.05))
        with pytest.raises(DeadlineExceeded, match="no chunk"):
            await stream.__anext__()
        Counter.gate.set()


async def test_deadline_of_the_whole_stream() -> None:
    async with counter_service() as service:
        stream = service.stream("pid", timeout_s=0.2)
        received = 0
        with pytest.raises(DeadlineExceeded, match="did not end"):
            async for _ in stream:
                received += 1
        assert received >= 1


async def test_lockstep_for_a_generator_predict() -> None:
    service = Service(Stage(Lockstep, mode="thread", max_batch_size=8))
    async with service:
        assert service.can_stream()
        results = await asyncio.gather(*(chunks_of(service.stream(n)) for n in (1, 3, 2)))
        assert results == [[0], [0, 1, 2], [0, 1]]
        assert await service.submit(2) == [0, 1]


class OneShot(Model):
    def predict(self, batch: list[int]) -> list[int]:
        return batch


async def test_a_model_that_does_not_stream_says_so() -> None:
    async with Service(Stage(OneShot, mode="thread")) as service:
        assert not service.can_stream()
        with pytest.raises(TypeError, match="does not stream"):
            service.stream(1)


async def test_close_lets_open_streams_finish_within_the_grace_period() -> None:
    service = counter_service()
    await service.start()
    stream = service.stream("a:5")
    assert await stream.__anext__() == "a-0"
    closing = asyncio.ensure_future(service.close())
    await asyncio.sleep(0)
    with pytest.raises(BatcherClosed):
        service.stream("b:1")
    assert await chunks_of(stream) == [f"a-{k}" for k in range(1, 5)]
    await closing


async def test_close_ends_the_streams_left_after_the_grace_period() -> None:
    service = Service(Stage(Counter, mode="thread"), grace_s=0.05)
    await service.start()
    stream = service.stream("pid")
    await stream.__anext__()
    await service.close()
    with pytest.raises(BatcherClosed):
        await chunks_of(stream)


def test_a_plain_thread_iterates_a_stream() -> None:
    loop = asyncio.new_event_loop()
    service = counter_service()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(service.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert ready.wait(30)
        assert list(service.stream_blocking("t:3")) == ["t-0", "t-1", "t-2"]
        endless = service.stream_blocking("pid")
        next(endless)
        endless.close()  # type: ignore[attr-defined]
        assert list(service.stream_blocking("u:1", timeout_s=5)) == ["u-0"]
    finally:
        asyncio.run_coroutine_threadsafe(service.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


async def test_a_dropped_stream_leaves() -> None:
    async with counter_service(max_batch_size=1) as service:
        endless = service.stream("pid")
        await endless.__anext__()
        del endless  # nobody reads it any more
        assert await chunks_of(service.stream("next:1")) == ["next-0"]


async def test_a_pipeline_streams_its_last_stage() -> None:
    service = Service(Stage(Name, mode="thread"), Stage(Counter, mode="thread", max_batch_size=4))
    async with service:
        assert service.can_stream() and service.can_stream("Counter")
        assert not service.can_stream("Name")
        streams = [service.stream(n) for n in (1, 3)]
        assert [await chunks_of(s) for s in streams] == [
            ["item1-0"],
            ["item3-0", "item3-1", "item3-2"],
        ]
        assert await chunks_of(service.stream("x:2", route="Counter")) == ["x-0", "x-1"]
        assert await service.submit(2) == ["item2-0", "item2-1"]
        left = service.stream(5)
        assert await left.__anext__() == "item5-0"
        await left.aclose()  # type: ignore[attr-defined]
        assert service.stats().in_flight == 0


def _length(item: str) -> float:
    return float(item.split(":")[1])


async def test_a_stage_keeps_its_active_streams_within_max_batch_cost() -> None:
    """cost_fn = the item's length, summed, budget 6: at most 6 length units active
    per step; an item of length 7 is refused before its stream starts."""
    async with counter_service(cost_fn=_length, max_batch_cost=6, batch_cost="sum") as service:
        with pytest.raises(ItemTooLarge, match="exceeds max_batch_cost=6"):
            service.stream("big:7")
        names = ["a:3", "b:3", "c:2", "d:4", "e:1"]
        outcomes = await asyncio.gather(*(chunks_of(service.stream(n)) for n in names))
        assert outcomes == [[f"{n[0]}-{k}" for k in range(int(n[2]))] for n in names]
        lengths = {n[0]: int(n[2]) for n in names}
        for step in Counter.steps:
            assert sum(lengths.get(name, 0) for name in step) <= 6, step
