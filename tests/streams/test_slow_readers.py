"""A caller that reads a stream more slowly than its chunks come cannot make the
server buffer without bound: after ``max_buffered`` unread chunks its stream ends
with SlowReader (after the chunks that came), and its item leaves at the next step,
freeing its place. In the step loop (one process), and under ``serve --workers``,
where the front holds the chunks relayed from the hub over a real socket pair.

Every await is bounded in real time: a stream that is never ended fails the test.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from microbatch import Service, Stage
from microbatch.http.metrics import RequestCollector
from microbatch.serve.front import RelayTarget
from microbatch.serve.hub import Hub
from microbatch.step_execution import InlineStepRunner, StepExecutor
from microbatch.stepping import StepLoop
from microbatch.streams import Channel, SlowReader
from microbatch.testing import FakeClock

from .models import Counter

BOUND_S = 20.0


async def _read_all(stream: AsyncIterator[Any]) -> tuple[list[Any], BaseException | None]:
    chunks: list[Any] = []
    try:
        async for chunk in stream:
            chunks.append(chunk)
    except Exception as error:
        return chunks, error
    return chunks, None


async def _bounded(stream: AsyncIterator[Any]) -> tuple[list[Any], BaseException | None]:
    return await asyncio.wait_for(_read_all(stream), BOUND_S)


async def test_an_unread_stream_ends_after_max_buffered_chunks_and_frees_its_place() -> None:
    loop = StepLoop(
        InlineStepRunner(StepExecutor(Counter())), max_active=1, max_buffered=3, clock=FakeClock()
    )
    slow = loop.open("pid")  # endless; its caller does not read it yet
    other = loop.open("b:2")  # waits for the one place
    assert await _bounded(other) == (["b-0", "b-1"], None)
    chunks, error = await _bounded(slow)
    assert len(chunks) == 3 and isinstance(error, SlowReader)
    assert "3 chunks waited unread" in str(error) and error.http_status == 408
    # Stepped for its three chunks and the one that did not fit, then never again.
    assert sum("pid" in names for names in Counter.steps) == 4
    assert Counter.steps[4:] == [["b"], ["b"]]
    assert loop.load == 0
    await asyncio.wait_for(loop.close(), BOUND_S)


async def test_a_reader_that_keeps_up_is_never_cut() -> None:
    loop = StepLoop(
        InlineStepRunner(StepExecutor(Counter())), max_active=2, max_buffered=1, clock=FakeClock()
    )
    chunks, error = await _bounded(loop.open("a:50"))
    assert error is None and chunks == [f"a-{k}" for k in range(50)]
    await asyncio.wait_for(loop.close(), BOUND_S)


def test_max_buffered_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_buffered"):
        StepLoop(InlineStepRunner(StepExecutor(Counter())), max_active=1, max_buffered=0)
    with pytest.raises(ValueError, match="max_buffered"):
        Channel(0, "x", deadline=None, first_chunk_deadline=None, clock=FakeClock(), max_buffered=0)


@asynccontextmanager
async def _relayed(
    max_buffered_chunks: int,
) -> AsyncIterator[tuple[Service[str, Any], RelayTarget]]:
    """A hub serving Counter one item at a time, and a front on a real socket pair."""
    service: Service[str, Any] = Service(Stage(Counter, mode="thread", max_batch_size=1))
    await service.start()
    hub = Hub(service)
    ours, theirs = socket.socketpair()
    hello = await hub.connect(0, ours)
    relay = RelayTarget(
        "counter", str, Any, theirs, streaming=[None], max_buffered_chunks=max_buffered_chunks
    )
    relay.requests = RequestCollector()
    await relay.start()
    await asyncio.wait_for(hello, BOUND_S)
    try:
        yield service, relay
    finally:
        await relay.close()
        hub.close()
        await service.close()


async def test_under_workers_a_slow_reader_is_ended_at_the_front_and_cancelled_in_the_hub() -> None:
    async with _relayed(max_buffered_chunks=8) as (service, relay):
        slow = relay.stream("pid")  # endless
        first = await asyncio.wait_for(slow.__anext__(), BOUND_S)
        assert isinstance(first, int)
        # The caller stops reading. One item at a time: the next stream can only run
        # once the hub has let the slow one go (nothing else would end it).
        assert await _bounded(relay.stream("b:2")) == (["b-0", "b-1"], None)
        chunks, error = await _bounded(slow)
        assert isinstance(error, SlowReader), error
        assert chunks == [first] * 8  # what waited at the front, no more
        assert "8 chunks waited unread" in str(error)
        streams = service.stats().stages[0].streams
        assert streams is not None and streams.active == 0


async def test_a_stage_sets_the_bound_of_its_streams() -> None:
    service: Service[str, Any] = Service(
        Stage(Counter, mode="thread", max_batch_size=1, max_buffered_chunks=2)
    )
    await asyncio.wait_for(service.start(), BOUND_S)
    try:
        slow = service.stream("pid")  # endless; not read yet
        assert await _bounded(service.stream("b:2")) == (["b-0", "b-1"], None)
        chunks, error = await _bounded(slow)
        assert len(chunks) == 2 and isinstance(error, SlowReader)
        assert "2 chunks waited unread" in str(error)
    finally:
        await asyncio.wait_for(service.close(), BOUND_S)


def test_a_stage_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_buffered_chunks"):
        Stage(Counter, mode="thread", max_buffered_chunks=0)
    assert Stage(Counter, mode="thread", max_buffered_chunks=None).max_buffered_chunks is None
