"""Property-based schedules of streams through a real worker process, killed at
random moments (``SIGKILL``), with callers who leave mid-way and items that fail.

Hypothesis draws the streams (length, an item error at some step, a caller who
stops reading after some chunks) and the moments the worker is killed (after the
n-th chunk handed out in all). Every stream must get its own chunks, in order,
and exactly one end: all of them; or those before its own error; or those before
the kill that took its worker (``WorkerDied``, only if a kill happened); a caller
who left gets nothing more. Nothing hangs, and after each schedule the stage has
no active stream and serves a fresh one from a live worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from microbatch import ItemError, Service, Stage, WorkerDied

from .models import Paced
from .test_process_streams import _wait_gone as wait_gone

_BOUND_S = 30.0  # real seconds one schedule may take: a hang fails, not stalls


@dataclass(frozen=True)
class Plan:
    length: int
    fails_at: int | None  # its item raises at this step
    leaves_after: int | None  # its caller stops reading after this many chunks


plans = st.builds(
    Plan,
    length=st.integers(1, 25),
    fails_at=st.none() | st.integers(0, 24),
    leaves_after=st.none() | st.integers(0, 24),
)


@dataclass
class Seen:
    chunks: list[Any]
    end: BaseException | str | None = None  # "complete", "left", or the error


def test_streams_through_a_killed_worker_each_get_their_own_chunks_and_one_end() -> None:
    loop = asyncio.new_event_loop()
    service = Service(Stage(Paced, max_batch_size=4, max_queue=1000))
    loop.run_until_complete(service.start())
    try:

        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(streams=st.lists(plans, min_size=1, max_size=10), kills=_kills())
        def schedule(streams: list[Plan], kills: list[int]) -> None:
            loop.run_until_complete(asyncio.wait_for(_run(service, streams, kills), _BOUND_S))

        schedule()
    finally:
        loop.run_until_complete(service.close())
        loop.close()


def _kills() -> st.SearchStrategy[list[int]]:
    """After how many chunks in all the worker is killed (at most twice)."""
    return st.lists(st.integers(0, 60), max_size=2, unique=True).map(sorted)


async def _run(service: Service[str, list[Any]], streams: list[Plan], kills: list[int]) -> None:
    chunks_seen = 0
    killed_pids: list[int] = []
    pending_kills: Iterator[int] = iter(kills)
    next_kill = next(pending_kills, None)

    def maybe_kill() -> None:
        nonlocal next_kill
        while next_kill is not None and chunks_seen >= next_kill:
            pids = service.pools[0].pids
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed_pids.append(pids[0])
            next_kill = next(pending_kills, None)

    async def read(index: int, plan: Plan) -> Seen:
        nonlocal chunks_seen
        item = f"s{index}:{plan.length}" + (
            f":fail@{plan.fails_at}" if plan.fails_at is not None else ""
        )
        seen = Seen([])
        stream = service.stream(item)
        try:
            if plan.leaves_after == 0:  # opened, then left before its first chunk
                seen.end = "left"
                return seen
            async for chunk in stream:
                seen.chunks.append(chunk)
                chunks_seen += 1
                maybe_kill()
                if plan.leaves_after is not None and len(seen.chunks) >= plan.leaves_after:
                    seen.end = "left"
                    return seen
            seen.end = "complete"
        except (ItemError, WorkerDied) as error:
            seen.end = error
        finally:
            await stream.aclose()
        return seen

    maybe_kill()  # a kill at 0: before any stream
    seen = await asyncio.gather(*(read(i, plan) for i, plan in enumerate(streams)))
    for index, (plan, got) in enumerate(zip(streams, seen, strict=True)):
        event(f"a stream ended: {got.end if isinstance(got.end, str) else type(got.end).__name__}")
        own = [f"s{index}-{k}" for k in range(plan.length)]
        assert got.chunks == own[: len(got.chunks)], (plan, got)  # its own, in order
        failing = plan.fails_at is not None and plan.fails_at < plan.length
        if got.end == "complete":
            assert got.chunks == own and not failing
        elif got.end == "left":
            assert len(got.chunks) == plan.leaves_after
        elif isinstance(got.end, ItemError):
            assert failing and len(got.chunks) == plan.fails_at, (plan, got)
        else:
            assert isinstance(got.end, WorkerDied) and killed_pids, (plan, got)
    # The stage is clean, and serves from a live worker (once the last one killed
    # is gone: a stream sent to a worker in its last moments fails with it).
    event(f"workers killed: {len(killed_pids)}")
    for pid in killed_pids:
        await asyncio.get_running_loop().run_in_executor(None, wait_gone, pid)
    assert await service.submit("after:3") == ["after-0", "after-1", "after-2"]
    stats = service.stats().stages[0].streams
    assert stats is not None and stats.active == 0
