"""The order of work around a step: a new stream's first chunk wakes its reader
before the running streams' next chunks wake theirs, and with a runner that steps
elsewhere (a thread, a process) the next step starts before the readers read, so
that the two overlap."""

from __future__ import annotations

import asyncio
from typing import Any

from microbatch.step_execution import StepExecutor
from microbatch.stepping import StepDone, StepJob, StepLoop
from microbatch.streams import Stream
from microbatch.testing import FakeClock

from .models import Counter

BOUND_S = 20.0


async def _read(name: str, stream: Stream, into: list[tuple[str, Any]]) -> None:
    async for chunk in stream:
        into.append((name, chunk))


class GatedRunner:
    """Each step waits until the test releases it."""

    def __init__(self) -> None:
        self.executor = StepExecutor(Counter())
        self.gate: asyncio.Future[None] | None = None

    async def advance(self, job: StepJob) -> StepDone:
        self.gate = asyncio.get_running_loop().create_future()
        await self.gate
        return self.executor.advance(job)

    async def release(self) -> None:
        assert self.gate is not None
        self.gate.set_result(None)
        await _turns()


async def _turns(count: int = 8) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_new_streams_first_chunk_is_read_before_the_running_streams_next_ones() -> None:
    runner = GatedRunner()
    loop = StepLoop(runner, max_active=4, clock=FakeClock())
    read: list[tuple[str, Any]] = []
    running = asyncio.create_task(_read("a", loop.open("a:4"), read))
    await _turns()
    await runner.release()  # a-0; the next step (a alone) started already
    joining = asyncio.create_task(_read("b", loop.open("b:2"), read))
    await _turns()  # both readers wait for their next chunk
    await runner.release()  # a-1
    await runner.release()  # b joins: b-0 and a-2
    assert read == [("a", "a-0"), ("a", "a-1"), ("b", "b-0"), ("a", "a-2")]
    await runner.release()
    await asyncio.wait_for(asyncio.gather(running, joining), BOUND_S)
    assert read[4:] == [("a", "a-3"), ("b", "b-1")]  # the running ones in step order
    await asyncio.wait_for(loop.close(), BOUND_S)


class ElsewhereRunner:
    """Steps "elsewhere": each step suspends the caller (as a thread or a process
    would); records how many chunks had been read when each step started."""

    def __init__(self, read: list[tuple[str, Any]]) -> None:
        self.executor = StepExecutor(Counter())
        self.read = read
        self.read_at_start: list[int] = []

    async def advance(self, job: StepJob) -> StepDone:
        self.read_at_start.append(len(self.read))
        await asyncio.sleep(0)
        return self.executor.advance(job)


async def test_the_next_step_starts_before_the_readers_read_the_last_one() -> None:
    read: list[tuple[str, Any]] = []
    runner = ElsewhereRunner(read)
    loop = StepLoop(runner, max_active=1, clock=FakeClock())
    await asyncio.wait_for(_read("a", loop.open("a:4"), read), BOUND_S)
    assert len(read) == 4
    # Step k+1 starts as step k's chunk is delivered, before its reader has read it.
    assert runner.read_at_start == [0, 0, 1, 2]
    await asyncio.wait_for(loop.close(), BOUND_S)


class HandOverRunner:
    """Takes each job at the call, as a runner in a thread does, and answers it when
    the test says; records how many chunks the stream had been handed at each call."""

    def __init__(self) -> None:
        self.executor = StepExecutor(Counter())
        self.stream: Stream | None = None
        self.jobs: list[tuple[StepJob, asyncio.Future[StepDone]]] = []
        self.handed_at_call: list[int] = []

    def advance(self, job: StepJob) -> asyncio.Future[StepDone]:
        assert self.stream is not None
        self.handed_at_call.append(self.stream.chunks_sent)
        future: asyncio.Future[StepDone] = asyncio.get_running_loop().create_future()
        self.jobs.append((job, future))
        return future

    async def answer(self) -> None:
        job, future = self.jobs[-1]
        future.set_result(self.executor.advance(job))
        await _turns()


async def test_a_runner_that_takes_the_job_at_the_call_gets_the_next_step_first() -> None:
    runner = HandOverRunner()
    loop = StepLoop(runner, max_active=1, clock=FakeClock())
    runner.stream = stream = loop.open("a:3")
    read: list[tuple[str, Any]] = []
    reading = asyncio.create_task(_read("a", stream, read))
    await _turns()
    for _ in range(3):
        await runner.answer()
    await asyncio.wait_for(reading, BOUND_S)
    assert read == [("a", "a-0"), ("a", "a-1"), ("a", "a-2")]
    # Step k+1 was handed over before step k's chunk was handed to the stream.
    assert runner.handed_at_call == [0, 0, 1]
    await asyncio.wait_for(loop.close(), BOUND_S)


class JoinRecorder:
    """Steps "elsewhere" (each step suspends the caller, as a thread would) and
    records the items that joined each step, and how many streams their callers
    had read to the end (``ends_read``, which they count) when it started."""

    def __init__(self) -> None:
        self.executor = StepExecutor(Counter())
        self.joined: list[tuple[Any, ...]] = []
        self.ends_read = 0
        self.ends_read_at_start: list[int] = []

    async def advance(self, job: StepJob) -> StepDone:
        self.joined.append(job.join_items)
        self.ends_read_at_start.append(self.ends_read)
        await asyncio.sleep(0)
        return self.executor.advance(job)

    def step_joined(self, item: str) -> int:
        """The index of the step ``item`` joined."""
        return next(index for index, items in enumerate(self.joined) if item in items)


async def test_a_caller_who_comes_straight_back_joins_the_very_next_step() -> None:
    runner = JoinRecorder()
    loop = StepLoop(runner, max_active=2, clock=FakeClock())
    long = asyncio.create_task(_read("z", loop.open("z:12"), []))

    async def closed_loop() -> None:  # each next stream opened as the last one ended
        for name in ("a", "b", "c"):
            async for _ in loop.open(f"{name}:2"):
                pass

    await asyncio.wait_for(closed_loop(), BOUND_S)
    await asyncio.wait_for(long, BOUND_S)
    first = runner.step_joined("a:2")
    # Two steps each: the next one joins the step right after its predecessor's last.
    assert [runner.step_joined(item) for item in ("b:2", "c:2")] == [first + 2, first + 4]
    await asyncio.wait_for(loop.close(), BOUND_S)


async def test_callers_who_come_back_later_do_not_hold_up_the_next_step() -> None:
    runner = JoinRecorder()
    loop = StepLoop(runner, max_active=2, clock=FakeClock())
    long = asyncio.create_task(_read("z", loop.open("z:400"), []))
    names = [f"s{index}:1" for index in range(20)]  # one step each
    for name in names:
        async for _ in loop.open(name):
            pass
        runner.ends_read += 1
        await _turns(4)  # the caller comes back a while after its stream ended
    await asyncio.wait_for(long, BOUND_S)
    # Whether the step after each one-step stream waited for its caller to read the end.
    waited = [
        runner.ends_read_at_start[runner.step_joined(name) + 1] == index + 1
        for index, name in enumerate(names)
    ]
    # It waits at first; once nobody came back in those turns, the steps go at once
    # (but for a probe now and then: one in the first 16 chances).
    assert waited[0] and sum(waited[4:]) <= 1
    await asyncio.wait_for(loop.close(), BOUND_S)
