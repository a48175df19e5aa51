"""The order of work around a step: a new stream's first chunk wakes its reader
before the running streams' next chunks wake theirs, and with a runner that steps
elsewhere (a thread, a process) the next step starts before the readers read, so
that the two overlap."""

from __future__ import annotations

import asyncio
from typing import Any

from microbatch.step_execution import InlineStepRunner, StepExecutor
from microbatch.stepping import StepDone, StepJob, StepLoop
from microbatch.streams import Stream
from microbatch.testing import FakeClock

from .models import Counter

BOUND_S = 20.0


async def _read(name: str, stream: Stream, into: list[tuple[str, Any]]) -> None:
    async for chunk in stream:
        into.append((name, chunk))


async def test_a_new_streams_first_chunk_is_read_before_the_running_streams_next_ones() -> None:
    loop = StepLoop(InlineStepRunner(StepExecutor(Counter())), max_active=4, clock=FakeClock())
    read: list[tuple[str, Any]] = []
    stream = loop.open("a:6")
    for _ in range(2):
        read.append(("a", await asyncio.wait_for(stream.__anext__(), BOUND_S)))
    running = asyncio.create_task(_read("a", stream, read))
    joining = asyncio.create_task(_read("b", loop.open("b:2"), read))
    await asyncio.wait_for(asyncio.gather(running, joining), BOUND_S)
    first_b = read.index(("b", "b-0"))
    assert read[first_b + 1][0] == "a", read  # the step's other chunk came after it
    assert [chunk for name, chunk in read if name == "a"] == [f"a-{k}" for k in range(6)]
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
