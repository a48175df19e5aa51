"""The Batcher over a runner that can begin a batch without a task
(:class:`~microbatch.batcher.BeginsBatches`): what it is handed and when, and how
its report settles the callers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from microbatch import Batcher
from microbatch.batcher import BeginsBatches
from microbatch.testing import FakeClock
from microbatch.types import BatchDone, BatchJob
from tests.conftest import settle


class BegunRunner:
    """A runner that only begins batches (``run`` must not be called) and holds
    every one until the test reports it."""

    def __init__(self) -> None:
        self.jobs: list[BatchJob] = []
        self.reports: list[Callable[[BatchDone], None]] = []

    def running_since(self) -> float | None:
        return None

    async def run(self, job: BatchJob) -> BatchDone:
        raise AssertionError("a runner that begins batches is never run()")

    def begin(self, job: BatchJob, on_done: Callable[[BatchDone], None]) -> None:
        self.jobs.append(job)
        self.reports.append(on_done)

    def report(self, index: int, failed: bool = False) -> None:
        """Report batch ``index`` (every item times ten, or every item failed)."""
        items = self.jobs[index].items
        outcomes = [ValueError(f"{x} failed") if failed else x * 10 for x in items]
        self.reports[index](BatchDone(outcomes, 100.0, 100.1, len(items)))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=100.0)


def test_a_runner_with_begin_is_recognised() -> None:
    assert isinstance(BegunRunner(), BeginsBatches)


async def test_a_batch_is_handed_over_in_the_round_it_is_released(clock: FakeClock) -> None:
    runner = BegunRunner()
    batcher: Batcher[int, int] = Batcher(runner=runner, clock=clock, max_batch_size=4)
    futures = [batcher.submit_nowait(x) for x in range(3)]
    await asyncio.sleep(0)  # one loop round: the round's arrivals are released
    assert [job.items for job in runner.jobs] == [[0, 1, 2]]  # no task, no second round
    runner.report(0)
    # Settled within the report itself, not a loop round later.
    assert [future.result() for future in futures] == [0, 10, 20]
    stats = batcher.stats()
    assert (stats.batches, stats.items, stats.in_flight) == (1, 3, 0)


async def test_a_full_batch_is_handed_over_from_the_submit_itself(clock: FakeClock) -> None:
    runner = BegunRunner()
    batcher: Batcher[int, int] = Batcher(runner=runner, clock=clock, max_batch_size=2)
    first = batcher.submit_nowait(1)
    second = batcher.submit_nowait(2)
    assert [job.items for job in runner.jobs] == [[1, 2]]
    runner.report(0)
    assert (first.result(), second.result()) == (10, 20)


async def test_after_a_report_the_next_batch_takes_the_rounds_arrivals(clock: FakeClock) -> None:
    runner = BegunRunner()
    batcher: Batcher[int, int] = Batcher(
        runner=runner, clock=clock, max_batch_size=8, max_concurrent_batches=1, run_ahead=False
    )
    futures = [batcher.submit_nowait(0)]
    await settle()
    futures += [batcher.submit_nowait(x) for x in (1, 2)]
    await settle()
    assert [job.items for job in runner.jobs] == [[0]]  # the one slot is busy
    runner.report(0)
    assert futures[0].result() == 0  # answered at once
    futures.append(batcher.submit_nowait(3))  # read in the same round as the result
    await asyncio.sleep(0)  # the end of that round
    assert [job.items for job in runner.jobs] == [[0], [1, 2, 3]]
    runner.report(1)
    assert [future.result() for future in futures] == [0, 10, 20, 30]


async def test_errors_in_a_report_fail_their_items_alone(clock: FakeClock) -> None:
    runner = BegunRunner()
    batcher: Batcher[int, int] = Batcher(runner=runner, clock=clock, max_batch_size=2)
    futures = [batcher.submit_nowait(x) for x in range(2)]
    runner.report(0, failed=True)
    for future in futures:
        with pytest.raises(ValueError, match="failed"):
            future.result()
    assert batcher.stats().failed == 2


async def test_a_caller_who_left_is_not_wanted_at_the_runner(clock: FakeClock) -> None:
    runner = BegunRunner()
    batcher: Batcher[int, int] = Batcher(runner=runner, clock=clock, max_batch_size=2)
    first = batcher.submit_nowait(1)
    second = batcher.submit_nowait(2)
    (job,) = runner.jobs
    first.cancel()
    assert not job.wanted(0) and job.wanted(1)
    runner.report(0)
    assert second.result() == 20


async def test_close_waits_for_a_begun_batch(clock: FakeClock) -> None:
    runner = BegunRunner()
    batcher: Batcher[int, int] = Batcher(runner=runner, clock=clock, max_batch_size=1)
    future = batcher.submit_nowait(7)
    closing = asyncio.create_task(batcher.close())
    await settle()
    assert not closing.done()
    runner.report(0)
    await asyncio.wait_for(closing, timeout=5)
    assert future.result() == 70
