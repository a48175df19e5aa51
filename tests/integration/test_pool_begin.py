"""ProcessPool.begin: a batch handed over without a task, reported once through a
callback (the batcher's way to a worker process without a loop round each way)."""

from __future__ import annotations

import asyncio

import pytest

from microbatch.batcher import BeginsBatches
from microbatch.errors import ItemError, StageFailed
from microbatch.pipeline import ProcessPool, Stage
from microbatch.types import BatchDone
from tests.integration.jobs import job
from tests.integration.pool_models import Gate, Gated, Strict

pytestmark = pytest.mark.timeout(120)


class Reports:
    """Collects a pool's reports; a future for the first."""

    def __init__(self) -> None:
        self.done: list[BatchDone] = []
        self.first: asyncio.Future[BatchDone] = asyncio.get_running_loop().create_future()

    def __call__(self, done: BatchDone) -> None:
        self.done.append(done)
        if not self.first.done():
            self.first.set_result(done)


async def test_a_begun_batch_is_reported_once_with_its_outcomes_and_times() -> None:
    pool = ProcessPool(Stage(Strict))
    assert isinstance(pool, BeginsBatches)
    await pool.start()
    try:
        await pool.warm_up([])
        reports = Reports()
        pool.begin(job([1, 2, 3]), reports)
        done = await asyncio.wait_for(reports.first, timeout=30)
        await asyncio.sleep(0)  # a second report would come by now
    finally:
        await pool.close()
    assert len(reports.done) == 1
    assert done.outcomes[:2] == [2, 3] and isinstance(done.outcomes[2], ItemError)
    assert done.started_s is not None and done.finished_s is not None
    assert done.started_s <= done.finished_s and done.units == 3


async def test_a_closed_pool_reports_from_the_loop_not_from_begin() -> None:
    pool = ProcessPool(Stage(Strict))
    await pool.start()
    await pool.warm_up([])
    await pool.close()
    reports = Reports()
    pool.begin(job([1, 2]), reports)
    assert reports.done == []  # never from within begin()
    done = await asyncio.wait_for(reports.first, timeout=30)
    assert len(done.outcomes) == 2
    assert all(isinstance(outcome, StageFailed) for outcome in done.outcomes)


async def test_a_begun_batch_cut_by_close_is_reported_once(gate: Gate) -> None:
    pool = ProcessPool(Stage(Gated, args=gate.args))
    await pool.start()
    await pool.warm_up([])
    reports = Reports()
    pool.begin(job([-1]), reports)  # held by the model until the gate opens
    await gate.started()
    closing = asyncio.create_task(pool.close())
    await asyncio.sleep(0)  # close() has begun: it tells the worker to stop
    gate.release()  # the worker finishes the batch it holds, then exits
    await asyncio.wait_for(closing, timeout=60)
    done = await asyncio.wait_for(reports.first, timeout=30)
    await asyncio.sleep(0)
    assert len(reports.done) == 1
    assert done.outcomes == [(-1, (-1,))]
