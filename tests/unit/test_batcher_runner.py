"""The asyncio Batcher over a BatchRunner: what the runner is handed, what the batcher
learns from its report, and lifecycle edges (two closes)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from microbatch import Batcher, DeadlineExceeded, FixedPolicy, QueueState
from microbatch.testing import FakeClock
from microbatch.types import BatchDone, BatchJob
from tests.conftest import settle


class HeldRunner:
    """A runner that holds every job until the test finishes it."""

    def __init__(self, since: float | None = None) -> None:
        self.jobs: list[BatchJob] = []
        self.done: list[asyncio.Future[BatchDone]] = []
        self.since = since

    def running_since(self) -> float | None:
        return self.since

    async def run(self, job: BatchJob) -> BatchDone:
        self.jobs.append(job)
        future: asyncio.Future[BatchDone] = asyncio.get_running_loop().create_future()
        self.done.append(future)
        return await future

    def finish(self, index: int, started: float | None, finished: float | None) -> None:
        job = self.jobs[index]
        outcomes = [item * 10 if not isinstance(item, list) else item for item in job.items]
        self.done[index].set_result(BatchDone(outcomes, started, finished, job.units))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=100.0)


async def test_the_runner_gets_items_deadlines_and_units(clock: FakeClock) -> None:
    runner = HeldRunner()
    batcher: Batcher[int, int] = Batcher(
        runner=runner, clock=clock, max_batch_size=3, policy="fixed", size_fn=lambda x: 1
    )
    tasks = [asyncio.create_task(batcher.submit(x, deadline=200.0 + x)) for x in range(3)]
    await settle()
    (job,) = runner.jobs
    assert job.items == [0, 1, 2] and list(job.deadlines) == [200.0, 201.0, 202.0]
    assert job.units == 3 and all(job.wanted(i) for i in range(3))
    runner.finish(0, 100.0, 100.5)
    assert await asyncio.gather(*tasks) == [0, 10, 20]


async def test_with_rows_the_runner_gets_the_callers_parts_unmerged(clock: FakeClock) -> None:
    runner = HeldRunner()
    batcher: Batcher[list[int], list[int]] = Batcher(
        runner=runner, clock=clock, max_batch_size=4, policy="fixed", rows="list"
    )
    first = asyncio.create_task(batcher.submit([1, 2]))
    second = asyncio.create_task(batcher.submit([3, 4, 5, 6, 7]))  # parts of 4 and 1 rows
    await settle()
    assert [job.items for job in runner.jobs] == [[[1, 2]], [[3, 4, 5, 6]]]
    assert [job.units for job in runner.jobs] == [2, 4]
    runner.finish(0, None, None)
    runner.finish(1, None, None)
    await settle()
    clock.advance(0.01)  # the latency bound of the last part
    await settle()
    assert runner.jobs[2].items == [[7]]
    runner.finish(2, None, None)
    assert await first == [1, 2] and await second == [3, 4, 5, 6, 7]


async def test_wanted_turns_false_when_a_caller_leaves_or_expires_at_the_runner(
    clock: FakeClock,
) -> None:
    runner = HeldRunner()
    batcher: Batcher[int, int] = Batcher(
        runner=runner, clock=clock, max_batch_size=3, policy="fixed", max_latency_ms=1000
    )
    left = asyncio.create_task(batcher.submit(0))
    expiring = asyncio.create_task(batcher.submit(1, timeout_s=1.0))
    staying = asyncio.create_task(batcher.submit(2))
    await settle()
    (job,) = runner.jobs
    left.cancel()
    clock.advance(1.0)
    await settle()
    assert [job.wanted(i) for i in range(3)] == [False, False, True]
    runner.finish(0, 100.0, 101.0)
    assert await staying == 20
    with pytest.raises(DeadlineExceeded):
        await expiring


async def test_a_function_never_computes_an_item_whose_caller_left_while_handed_over(
    clock: FakeClock,
) -> None:
    gate = threading.Event()
    computed: list[list[int]] = []

    def model(xs: list[int]) -> list[int]:
        computed.append(list(xs))
        assert gate.wait(10), "test gate never opened"
        return [x * 10 for x in xs]

    batcher: Batcher[int, int] = Batcher(
        model, clock=clock, max_batch_size=2, policy="fixed", max_latency_ms=1000
    )
    first = asyncio.create_task(batcher.submit(0))
    await settle()
    clock.advance(1.0)
    waiting = [asyncio.create_task(batcher.submit(x)) for x in (1, 2)]
    await settle()  # a full batch, handed over to wait for the thread
    assert batcher.stats().in_flight == 3
    waiting[0].cancel()
    gate.set()
    assert await first == 0 and await waiting[1] == 20
    assert computed == [[0], [2]]


class Learning(FixedPolicy):
    """A fixed policy that records what it is taught."""

    def __init__(self) -> None:
        super().__init__(max_batch_size=2, max_latency_s=1.0)
        self.taught: list[tuple[int, float]] = []

    def batch_finished(self, size: int, duration_s: float) -> None:
        self.taught.append((size, duration_s))


async def test_the_cost_is_learned_from_the_runners_times_only(clock: FakeClock) -> None:
    runner = HeldRunner()
    batcher: Batcher[int, int] = Batcher(runner=runner, clock=clock, policy=Learning)
    policy = batcher.policy
    assert isinstance(policy, Learning)
    tasks = [asyncio.create_task(batcher.submit(x)) for x in range(2)]
    await settle()
    runner.finish(0, None, None)  # it never ran: nothing to learn
    await asyncio.gather(*tasks)
    assert policy.taught == []
    tasks = [asyncio.create_task(batcher.submit(x)) for x in range(2)]
    await settle()
    clock.advance(5.0)  # the batch waited at the runner: not its run time
    runner.finish(1, 104.0, 105.5)
    await asyncio.gather(*tasks)
    assert policy.taught == [(2, 1.5)]


class Recording(FixedPolicy):
    """A fixed policy that records what it was told while behind a running batch."""

    def __init__(self) -> None:
        super().__init__(max_batch_size=2, max_latency_s=1.0)
        self.behind: list[tuple[float, int]] = []

    def release_at(self, state: QueueState, now: float) -> float:
        if state.behind:
            self.behind.append((state.running_since_s, state.running_size))
        return super().release_at(state, now)


async def test_while_every_slot_is_busy_the_policy_reads_the_runners_ledger(
    clock: FakeClock,
) -> None:
    runner = HeldRunner(since=42.0)
    batcher: Batcher[int, int] = Batcher(
        runner=runner, clock=clock, max_batch_size=2, policy=Recording
    )
    tasks = [asyncio.create_task(batcher.submit(x)) for x in range(3)]
    await settle()
    policy = batcher.policy
    assert isinstance(policy, Recording)
    assert policy.behind and policy.behind[-1] == (42.0, 2)
    clock.advance(1.0)  # the latency bound: the third item is handed over ahead
    await settle()
    assert len(runner.jobs) == 2
    runner.finish(0, 100.0, 101.0)
    runner.finish(1, 101.0, 101.5)
    assert await asyncio.gather(*tasks) == [0, 10, 20]


async def test_two_concurrent_closes_both_return(clock: FakeClock) -> None:
    runner = HeldRunner()
    batcher: Batcher[int, int] = Batcher(runner=runner, clock=clock, max_batch_size=1)
    task = asyncio.create_task(batcher.submit(1))
    await settle()
    closes = [asyncio.create_task(batcher.close()) for _ in range(2)]
    await settle()
    runner.finish(0, 100.0, 100.1)
    assert await task == 10
    done, _ = await asyncio.wait(closes, timeout=5)
    assert done == set(closes), "a close() never returned"


async def test_a_batcher_takes_a_function_or_a_runner(clock: FakeClock) -> None:
    def model(xs: list[Any]) -> list[Any]:
        return xs

    with pytest.raises(TypeError, match="either"):
        Batcher(model, runner=HeldRunner())
    with pytest.raises(TypeError, match="either"):
        Batcher()


async def test_an_item_the_runner_answers_expired_counts_as_expired(clock: FakeClock) -> None:
    class Expiring(HeldRunner):
        async def run(self, job: BatchJob) -> BatchDone:
            return BatchDone([DeadlineExceeded("at the worker")] * len(job.items))

    batcher: Batcher[int, int] = Batcher(runner=Expiring(), clock=clock, max_batch_size=1)
    with pytest.raises(DeadlineExceeded):
        await batcher.submit(1, deadline=101.0)
    stats = batcher.stats()
    assert (stats.expired, stats.failed) == (1, 0)
