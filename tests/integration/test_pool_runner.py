"""The pools as BatchRunners: the times they report are the model's own, the ledger
of running batches, and the items left out before the model runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import pytest

from microbatch import BatchConfig, DeadlineExceeded
from microbatch.errors import ItemError, ResultLengthError
from microbatch.pipeline import ProcessPool, Service, Stage
from microbatch.pipeline.threads import ThreadPool
from microbatch.types import BatchDone, BatchJob
from tests.integration.jobs import job, outcomes
from tests.integration.pool_models import DropsARow, Gate, Gated, Strict

pytestmark = pytest.mark.timeout(120)

Mode = Literal["process", "thread"]
MODES = ["process", "thread"]


@asynccontextmanager
async def running(stage: Stage) -> AsyncIterator[ProcessPool | ThreadPool]:
    pool = ThreadPool(stage) if stage.mode == "thread" else ProcessPool(stage)
    await pool.start()
    try:
        await pool.warm_up([])
        yield pool
    finally:
        await pool.close()


async def behind_a_held_batch(
    pool: ProcessPool | ThreadPool, gate: Gate, waiting: BatchJob, held: Any = -1
) -> tuple[asyncio.Task[BatchDone], asyncio.Task[BatchDone]]:
    """Run a batch of ``held`` (the model holds it), then hand ``waiting`` over behind
    it (sent to the worker, or waiting for a model); the two runs."""
    first = asyncio.create_task(pool.run(job([held])))
    await gate.started()
    second = asyncio.create_task(pool.run(waiting))
    await asyncio.sleep(0)  # its first step
    return first, second


def left(job: BatchJob, index: int, wanted: list[bool]) -> None:
    """What a batcher does when item ``index``'s caller leaves."""
    wanted[index] = False
    if job.on_unwanted is not None:
        job.on_unwanted(index)


@pytest.mark.parametrize("mode", MODES)
async def test_a_batch_held_behind_a_running_one_starts_when_that_one_finished(
    gate: Gate, mode: Mode
) -> None:
    async with running(Stage(Gated, args=gate.args, mode=mode)) as pool:
        assert pool.running_since() is None
        first = asyncio.create_task(pool.run(job([-1])))
        await gate.started()
        since = pool.running_since()
        assert since is not None
        sent_at = time.monotonic()
        second = asyncio.create_task(pool.run(job([-2])))
        await asyncio.sleep(0)  # its first step: sent (process) or waiting for a model
        assert pool.running_since() == since  # waiting behind the running one: not running
        gate.release()
        a = await first
        await gate.started()
        assert a.started_s is not None and a.finished_s is not None
        assert since <= a.started_s < a.finished_s < time.monotonic()
        now_since = pool.running_since()
        assert now_since is not None and now_since >= a.finished_s
        gate.release()
        b = await second
        assert pool.running_since() is None
    assert b.started_s is not None and b.finished_s is not None
    assert b.started_s >= a.finished_s and b.started_s > sent_at
    assert (a.units, b.units) == (1, 1)
    assert (a.outcomes, b.outcomes) == ([(-1, (-1,))], [(-2, (-2,))])


@pytest.mark.parametrize("mode", MODES)
async def test_two_workers_run_two_batches_at_once(gate: Gate, mode: Mode) -> None:
    async with running(Stage(Gated, workers=2, args=gate.args, mode=mode)) as pool:
        first = asyncio.create_task(pool.run(job([-1])))
        second = asyncio.create_task(pool.run(job([-2])))
        await gate.started(2)  # both started while neither may finish
        since = pool.running_since()
        gate.release(2)
        a, b = await asyncio.gather(first, second)
    assert a.started_s is not None and a.finished_s is not None
    assert b.started_s is not None and b.finished_s is not None
    assert a.started_s < b.finished_s and b.started_s < a.finished_s
    assert since is not None and since <= min(a.started_s, b.started_s)


@pytest.mark.parametrize("mode", MODES)
async def test_an_item_expiring_while_its_batch_waits_at_a_busy_worker_is_left_out(
    gate: Gate, mode: Mode
) -> None:
    async with running(Stage(Gated, args=gate.args, mode=mode)) as pool:
        due = time.monotonic() + 0.2
        waiting = job([2, 3, 4], [None, due, None], units=30)
        first, second = await behind_a_held_batch(pool, gate, waiting)
        await asyncio.sleep(due - time.monotonic())  # the deadline passes while it waits
        gate.release()
        await first
        done = await second
    assert isinstance(done.outcomes[1], DeadlineExceeded)
    assert [done.outcomes[0], done.outcomes[2]] == [(2, (2, 4)), (4, (2, 4))]
    assert done.units == 20  # two of three items computed, of 30 units


@pytest.mark.parametrize("mode", MODES)
async def test_an_item_whose_caller_left_while_its_batch_waits_is_left_out(
    gate: Gate, mode: Mode
) -> None:
    async with running(Stage(Gated, args=gate.args, mode=mode)) as pool:
        wanted = [True, True, True]
        waiting = job([2, 3, 4], wanted=lambda index: wanted[index])
        first, second = await behind_a_held_batch(pool, gate, waiting)
        left(waiting, 1, wanted)
        await asyncio.sleep(0)  # the pool tells the worker (once per loop turn)
        gate.release()
        await first
        done = await second
    assert [done.outcomes[0], done.outcomes[2]] == [(2, (2, 4)), (4, (2, 4))]
    assert isinstance(done.outcomes[1], Exception) and done.units == 2


async def test_an_item_whose_caller_left_before_its_batch_was_sent_is_not_sent(
    gate: Gate,
) -> None:
    async with running(Stage(Gated, args=gate.args)) as pool:
        wanted = [True, False, True]
        done = await pool.run(job([2, threading.Lock(), 4], wanted=lambda index: wanted[index]))
    assert [done.outcomes[0], done.outcomes[2]] == [(2, (2, 4)), (4, (2, 4))]


@pytest.mark.parametrize("mode", MODES)
async def test_rows_parts_are_merged_for_the_model_and_expired_parts_left_out(
    gate: Gate, mode: Mode
) -> None:
    stage = Stage(Gated, args=gate.args, mode=mode, batching=BatchConfig(rows="list"))
    async with running(stage) as pool:
        due = time.monotonic() + 0.2
        parts = [[1, 2], [3], [4, 5, 6]]
        waiting = job(parts, [None, due, None], units=6)
        first, second = await behind_a_held_batch(pool, gate, waiting, held=[-1])
        await asyncio.sleep(due - time.monotonic())  # the deadline passes while it waits
        gate.release()
        await first
        done = await second
    seen = (1, 2, 4, 5, 6)  # one call of the model, the live parts' rows merged
    assert done.outcomes[0] == [(1, seen), (2, seen)]
    assert isinstance(done.outcomes[1], DeadlineExceeded)
    assert done.outcomes[2] == [(4, seen), (5, seen), (6, seen)]
    assert done.units == 5


@pytest.mark.parametrize("mode", MODES)
async def test_rows_results_of_the_wrong_length_fail_each_part(mode: Mode) -> None:
    stage = Stage(DropsARow, mode=mode, batching=BatchConfig(rows="list"))
    async with running(stage) as pool:
        results = await outcomes(pool, [[1, 2], [3]])
    assert all(isinstance(result, ResultLengthError) for result in results)


async def test_an_item_that_cannot_be_pickled_fails_alone() -> None:
    from tests.integration.pipeline_models import Identity

    async with running(Stage(Identity)) as pool:
        results = await outcomes(pool, [1, threading.Lock(), 3])
    assert results[0] == 1 and results[2] == 3
    assert isinstance(results[1], TypeError) and "cannot be sent" in str(results[1])


@pytest.mark.parametrize("mode", MODES)
async def test_an_item_error_from_a_model_reaches_the_caller_as_itself(mode: Mode) -> None:
    settings = BatchConfig(max_batch_size=8, max_latency_ms=50)
    async with Service(Stage(Strict, mode=mode, batching=settings)) as service:
        answers: list[Any] = await asyncio.gather(
            *(service.submit(x) for x in range(1, 8)), return_exceptions=True
        )
    assert [answers[i] for i in (0, 1, 3, 6)] == [2, 3, 5, 8]
    expected = ((2, "3 is a multiple of 3", 422), (4, "5 is not", 409), (5, "6 is a", 422))
    for index, message, status in expected:
        error = answers[index]
        assert isinstance(error, ItemError), error
        assert error.message.startswith(message) and error.http_status == status
