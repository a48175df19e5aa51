"""Lifecycle edges of the worker pools: a worker dying during close, large batches
and results crossing the pipe at once without /dev/shm, an item that cannot be
pickled waiting in the backlog, and a setup that fails."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import types
from pathlib import Path
from typing import Literal

import pytest

from microbatch import BatchConfig, BatcherClosed, DeadlineExceeded
from microbatch.errors import RemoteError, StageFailed, WorkerDied
from microbatch.pipeline import Service, Stage, arena, processes
from microbatch.pipeline.pool import ProcessPool
from microbatch.pipeline.processes import WorkerHandle
from microbatch.pipeline.threads import ThreadPool
from tests.integration.jobs import job
from tests.integration.pipeline_models import Identity, RaisesInSetup
from tests.integration.pool_models import Gate, Gated
from tests.integration.test_pipeline_lifecycle import children, eventually

pytestmark = pytest.mark.timeout(120)

ONE_BY_ONE = BatchConfig(max_batch_size=1, max_latency_ms=0)
MIB = 1 << 20


async def test_close_answers_every_caller_when_it_kills_a_worker(
    gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes, "_STOP_GRACE_S", 0.2)
    service = Service(Stage(Gated, args=gate.args, batching=ONE_BY_ONE), grace_s=0.01)
    await service.start()
    # -1 runs and never finishes; 2 waits at the worker behind it.
    calls = [asyncio.create_task(service.submit(x)) for x in (-1, 2)]
    await gate.started()
    # Close kills the worker once its grace period is over, with both batches inside.
    await asyncio.wait_for(service.close(), 30)
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
    assert all(isinstance(o, WorkerDied | StageFailed | BatcherClosed) for o in outcomes)
    assert not children()


async def test_without_dev_shm_a_large_batch_and_a_large_result_cross_and_the_loop_serves(
    gate: Gate, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(arena, "SHM_DIR", tmp_path / "no-shm")  # everything by pipe
    size = 16 * MIB  # far more than a pipe holds
    stage = Stage(Gated, args=(*gate.args, size), batching=ONE_BY_ONE)
    async with Service(stage) as service:
        first = asyncio.create_task(service.submit(-1))  # held; its result is large
        await gate.started()
        # A large batch for the busy worker, which reads it only after it has written
        # its large result: the event loop must go on meanwhile.
        second = asyncio.create_task(service.submit(b"x" * size))
        late = asyncio.create_task(service.submit(3, timeout_s=0.1))  # waits in the queue
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(late, 30)
        gate.release()
        results = await asyncio.wait_for(asyncio.gather(first, second), 60)
    assert [len(result) for result in results] == [size, size]


async def test_an_unpicklable_item_waiting_for_a_restarted_worker_is_answered(
    gate: Gate,
) -> None:
    async with Service(Stage(Gated, args=gate.args, batching=ONE_BY_ONE)) as service:
        (pid,) = service.pools[0].pids
        running = asyncio.create_task(service.submit(-1))
        queued = asyncio.create_task(service.submit(2))  # at the worker, behind -1
        lock = asyncio.create_task(service.submit(threading.Lock()))  # in the queue
        await gate.started()
        os.kill(pid, signal.SIGKILL)
        # 2 and the lock wait in the pool's backlog until the worker is back.
        outcomes = await asyncio.wait_for(
            asyncio.gather(running, queued, lock, return_exceptions=True), 30
        )
        assert isinstance(outcomes[0], WorkerDied)
        assert outcomes[1] == (2, (2,))
        assert isinstance(outcomes[2], TypeError) and "cannot be sent" in str(outcomes[2])
        assert await service.submit(4) == (4, (4,))
    assert not children()


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_a_setup_that_fails_shows_the_traceback_into_the_users_code(
    mode: Literal["process", "thread"],
) -> None:
    with pytest.raises(StageFailed) as caught:
        await Service(Stage(RaisesInSetup, mode=mode, setup_attempts=1)).start()
    text = str(caught.value)
    assert "FileNotFoundError: no weights at /nowhere" in text
    assert 'pipeline_models.py", line' in text and ", in setup" in text
    assert 'raise FileNotFoundError("no weights at /nowhere")' in text
    assert "microbatch/pipeline" not in text  # our own frames are left out


async def test_a_thread_stage_closed_while_a_batch_waits_for_a_model_answers_it(
    gate: Gate,
) -> None:
    pool = ThreadPool(Stage(Gated, args=gate.args, mode="thread"))
    await pool.start()
    await pool.warm_up([])
    first = asyncio.create_task(pool.run(job([-1])))
    await gate.started()
    second = asyncio.create_task(pool.run(job([2])))  # waits for the one model
    closing = asyncio.create_task(pool.close())
    await asyncio.sleep(0)  # close has begun: it waits for the running batch
    gate.release()
    done = await asyncio.wait_for(asyncio.gather(first, second, closing), 30)
    assert done[0].outcomes == [(-1, (-1,))]
    assert isinstance(done[1].outcomes[0], BatcherClosed) and done[1].started_s is None


async def test_a_batch_the_worker_cannot_unpickle_fails_its_items_not_the_worker() -> None:
    module = types.ModuleType("microbatch_serving_only")
    exec("class Token:\n    pass", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        async with Service(Stage(Identity)) as service:
            pids = service.pools[0].pids
            with pytest.raises(RemoteError, match="microbatch_serving_only"):
                await service.submit(module.Token())
            assert await service.submit(1) == 1 and service.pools[0].pids == pids
    finally:
        del sys.modules[module.__name__]


@pytest.mark.parametrize("when", ["first warm-up", "a restart's warm-up"])
async def test_a_worker_that_dies_just_after_its_warm_up_is_started_again(
    when: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The death lands between the warm-up's answer and the worker's first batch:
    # it must not leave the stage a worker short for good (a kill storm found it).
    warm = ProcessPool._warm
    victims: list[int] = []

    async def warm_then_die(self: ProcessPool, worker: WorkerHandle) -> list[object]:
        outcomes = await warm(self, worker)
        restarting = self.restarts > 0
        if not victims and restarting == (when == "a restart's warm-up"):
            victims.append(worker.process.pid)
            os.kill(worker.process.pid, signal.SIGKILL)
            await asyncio.wait_for(eventually(lambda: not worker.alive), 30)
        return outcomes

    monkeypatch.setattr(ProcessPool, "_warm", warm_then_die)
    stage = Stage(Identity, workers=2, batching=BatchConfig(max_batch_size=4))
    async with Service(stage, examples=[0]) as service:
        pool = service.pools[0]
        if when == "a restart's warm-up":
            os.kill(pool.pids[0], signal.SIGKILL)
        await asyncio.wait_for(eventually(lambda: len(victims) == 1 and pool.alive == 2), 60)
        assert victims[0] not in pool.pids
        assert await asyncio.gather(*(service.submit(x) for x in range(20))) == list(range(20))
    assert not children()
