"""Stages in real worker processes: routing, errors, crashes, lifecycle."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from microbatch import BatchConfig, BatcherClosed, DeadlineExceeded, Overloaded
from microbatch.errors import RemoteError, StageFailed, WorkerDied
from microbatch.pipeline import Service, Stage
from tests.integration.pipeline_models import (
    AddOne,
    Beacon,
    ExitsInSetup,
    Identity,
    Picky,
    RaisesInSetup,
    ReadsEnv,
    Signalled,
    Slow,
    Square,
)
from tests.integration.test_pipeline_lifecycle import eventually

pytestmark = pytest.mark.timeout(120)


def batching(**settings: object) -> BatchConfig:
    return BatchConfig(**{"max_batch_size": 16, "max_latency_ms": 2, **settings})  # type: ignore[arg-type]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_each_caller_gets_its_own_answer_from_two_workers() -> None:
    async with Service(Stage(Slow, workers=2, batching=batching(), args=(0.003,))) as service:
        results = await asyncio.gather(*(service.submit(i) for i in range(300)))
        pids = service.pools[0].pids
    assert [r[0] for r in results] == list(range(300))
    assert {r[1] for r in results} == set(pids)  # both workers served
    assert max(r[2] for r in results) > 1  # and batches formed
    assert all(gone(pid) for pid in pids)


async def test_three_stages_with_per_item_failures_short_circuit() -> None:
    service = Service(
        Stage(AddOne, batching=batching()),
        Stage(Picky, workers=2, batching=batching()),
        Stage(Square, batching=batching()),
        examples=[1, 2],
    )
    async with service:
        assert service.ready
        results = await asyncio.gather(
            *(service.submit(i) for i in range(400)), return_exceptions=True
        )
    for i, result in enumerate(results):
        x = i + 1
        if x % 11 == 0:
            assert isinstance(result, RemoteError) and result.type_name == "ArithmeticError"
            assert "eleven spoils the batch" in result.traceback_text
        elif x % 7 == 0:
            assert isinstance(result, RemoteError) and result.type_name == "ValueError"
            assert str(result) == f"ValueError: {x} is a multiple of 7"
        else:
            assert result == x * x


async def test_one_stage_alone_takes_that_stages_input_and_gives_its_output() -> None:
    service = Service(Stage(AddOne, batching=batching()), Stage(Square, batching=batching()))
    async with service:
        whole, first, second = await asyncio.gather(
            service.submit(2), service.submit(2, route="AddOne"), service.submit(2, route="Square")
        )
        with pytest.raises(KeyError, match="no route 'Cube'"):
            await service.submit(2, route="Cube")
        counts = [stats.batching.items for stats in service.stats().stages]
    assert (whole, first, second) == (9, 3, 4)
    assert counts == [2, 2]  # each stage ran its own item and the pipeline's


async def test_numpy_arrays_cross_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((64, 256), dtype=np.float32) for _ in range(20)]
    async with Service(Stage(Identity, batching=batching())) as service:
        back = await asyncio.gather(*(service.submit(a) for a in arrays))
    for sent, received in zip(arrays, back, strict=True):
        assert received.dtype == np.float32 and np.array_equal(sent, received)


async def test_a_killed_worker_answers_its_batch_worker_died_and_comes_back(
    tmp_path: Path,
) -> None:
    beacon = Beacon(tmp_path)
    stage = Stage(Signalled, workers=1, batching=batching(max_latency_ms=0), args=beacon.args)
    async with Service(stage) as service, beacon:
        pool = service.pools[0]
        (victim,) = pool.pids
        calls = [asyncio.create_task(service.submit(i)) for i in range(3)]
        await beacon.started()  # the worker holds a batch
        os.kill(victim, signal.SIGKILL)
        beacon.let_go()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert any(isinstance(r, WorkerDied) for r in results)
        assert all(isinstance(r, WorkerDied) or r[0] == i for i, r in enumerate(results))
        # The three calls of one loop round went as one batch, which died with the
        # worker: nothing waited for the new worker, so wait for it here.
        await eventually(lambda: pool.alive == 1)
        assert (await service.submit(7))[0] == 7  # a new worker took over
        assert pool.restarts == 1 and pool.pids != [victim]
        pids = pool.pids
    assert gone(victim) and all(gone(pid) for pid in pids)


async def test_an_idempotent_stage_runs_a_dead_workers_batch_again(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path)
    stage = Stage(Signalled, batching=batching(max_latency_ms=0), args=beacon.args, idempotent=True)
    async with Service(stage) as service, beacon:
        pool = service.pools[0]
        (victim,) = pool.pids
        call = asyncio.create_task(service.submit(1))
        assert await beacon.started() == [1]  # the worker holds it
        os.kill(victim, signal.SIGKILL)
        assert await beacon.started() == [1]  # run again
        beacon.let_go()
        item, pid, _ = await call
    assert (item, pool.restarts) == (1, 1)
    assert pid != victim  # by the worker that replaced it


@pytest.mark.parametrize("model", [ExitsInSetup, RaisesInSetup])
async def test_a_stage_that_cannot_set_up_fails_fast_and_clearly(model: type) -> None:
    service = Service(Stage(model, workers=2, setup_attempts=2))
    start = time.monotonic()
    with pytest.raises(StageFailed, match="died 2 times in setup") as caught:
        await service.start()
    assert time.monotonic() - start < 30
    if model is RaisesInSetup:
        assert "no weights at /nowhere" in str(caught.value)
    assert not service.ready
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("microbatch")]


async def test_deadlines_cover_the_pipeline_and_expired_items_are_dropped(
    tmp_path: Path,
) -> None:
    beacon = Beacon(tmp_path)
    stage = Stage(Signalled, batching=batching(max_latency_ms=0), args=beacon.args)
    async with Service(stage, Stage(Identity)) as service, beacon:
        blocker = asyncio.create_task(service.submit(0))
        assert await beacon.started() == [0]  # the worker holds it
        with pytest.raises(DeadlineExceeded):
            await service.submit(1, timeout_s=0.05)
        beacon.let_go()
        assert (await blocker)[0] == 0


async def test_too_many_items_in_flight_are_refused_at_once(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path)
    stage = Stage(Signalled, batching=batching(max_latency_ms=0), args=beacon.args)
    async with Service(stage, max_in_flight=2) as service, beacon:
        calls = [asyncio.create_task(service.submit(i)) for i in range(2)]
        await beacon.started()  # the worker holds them
        await eventually(lambda: service.stats().in_flight == 2)
        with pytest.raises(Overloaded):
            await service.submit(3)
        beacon.let_go()
        assert [r[0] for r in await asyncio.gather(*calls)] == [0, 1]


async def test_workers_get_their_environment_and_index() -> None:
    stage = Stage(ReadsEnv, workers=2, name="tagger", env={"MICROBATCH_TEST_TAG": "blue"})
    async with Service(stage) as service:
        tags = set(await asyncio.gather(*(service.submit(i) for i in range(50))))
    assert tags <= {"blue/tagger/0", "blue/tagger/1"} and tags


async def test_stats_and_readiness_follow_the_workers() -> None:
    stage = Stage(Slow, workers=2, batching=batching(), args=(0.001,))
    service = Service(stage, Stage(Identity, name="echo"))
    assert not service.ready
    async with service:
        await asyncio.gather(*(service.submit(i) for i in range(40)))
        stats = service.stats()
        assert stats.ready and not stats.draining and stats.in_flight == 0
        assert [s.name for s in stats.stages] == ["Slow", "echo"]
        assert [s.workers_alive for s in stats.stages] == [2, 1]
        assert all(s.batching.items == 40 for s in stats.stages)
    assert not service.ready and service.draining
    with pytest.raises(BatcherClosed):
        await service.submit(1)


async def test_a_batch_queued_behind_a_killed_one_runs_on_the_next_worker(
    tmp_path: Path,
) -> None:
    # Full batches of 2: the second waits in the worker's pipe while the first runs.
    settings = batching(max_batch_size=2, max_latency_ms=1000, policy="fixed")
    beacon = Beacon(tmp_path)
    async with Service(Stage(Signalled, batching=settings, args=beacon.args)) as service, beacon:
        (victim,) = service.pools[0].pids
        running = [asyncio.create_task(service.submit(i)) for i in range(2)]
        assert await beacon.started() == [0, 1]  # the worker holds the first
        queued = [asyncio.create_task(service.submit(i)) for i in range(2, 4)]
        # The second is handed to the pool, which sends it to the worker at once.
        await eventually(
            lambda: (
                service.stats().in_flight == 4 and service.stats().stages[0].batching.queued == 0
            )
        )
        os.kill(victim, signal.SIGKILL)
        died = await asyncio.gather(*running, return_exceptions=True)
        assert await beacon.started() == [2, 3]  # on the worker that replaced it
        beacon.let_go()
        ran = await asyncio.gather(*queued)
    assert all(isinstance(r, WorkerDied) for r in died)
    assert [r[0] for r in ran] == [2, 3] and all(r[1] != victim for r in ran)
