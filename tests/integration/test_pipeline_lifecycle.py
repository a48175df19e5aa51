"""The Service's lifecycle and placement: warm-up, thread stages, pinning, closing,
clear errors for models that cannot reach a spawned worker."""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from microbatch import BatchConfig, BatcherClosed, DeadlineExceeded
from microbatch.errors import RemoteError, StageFailed
from microbatch.pipeline import Model, ProcessPool, Service, Stage
from microbatch.pipeline.pool import BATCHES_PER_WORKER
from tests.integration.jobs import outcomes
from tests.integration.pipeline_models import (
    AddOne,
    Beacon,
    CountsBatches,
    FailsWarmUp,
    Identity,
    Picky,
    RaisesInSetup,
    ReportsCpus,
    ReturnsUnpicklable,
    SetsUpUnlessMarked,
    Signalled,
    Slow,
    Square,
)

pytestmark = pytest.mark.timeout(120)


def batching(**settings: Any) -> BatchConfig:
    return BatchConfig(**{"max_batch_size": 16, "max_latency_ms": 2, **settings})


def children() -> set[int]:
    """Live (not zombie) processes whose parent is this test process, except the
    resource tracker that multiprocessing keeps for the life of the process."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            mine = int(fields[1]) == os.getpid() and fields[0] != "Z"
            if mine and b"resource_tracker" not in command:
                found.add(int(entry.name))
    return found


async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait (bounded) for a condition that the event loop makes true."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - a test watching state it cannot subscribe to
            await asyncio.sleep(0.01)


async def test_examples_warm_up_every_worker_and_every_restart() -> None:
    service = Service(Stage(CountsBatches, workers=2, batching=batching()), examples=["warm"])
    async with service:
        pids = set(service.pools[0].pids)
        assert len(pids) == 2
        # Each worker ran the warm-up batch, so the first real batch is its second.
        results = await asyncio.gather(*(service.submit(i) for i in range(60)))
        assert {pid for _, pid, _ in results} <= pids
        assert min(n for _, _, n in results) >= 2
        victim = results[0][1]
        os.kill(victim, signal.SIGKILL)
        await eventually(lambda: victim not in service.pools[0].pids)
        await eventually(lambda: service.pools[0].alive == 2)
        replacement = set(service.pools[0].pids) - pids
        results = await asyncio.gather(*(service.submit(i) for i in range(60)))
    served_by_new = [n for _, pid, n in results if pid in replacement]
    assert min(served_by_new, default=2) >= 2  # warmed up before it took a batch


async def test_a_failing_warm_up_example_fails_start_and_says_which() -> None:
    service = Service(Stage(FailsWarmUp), examples=["fine", "bad example"])
    with pytest.raises(StageFailed, match="warm-up") as caught:
        await service.start()
    assert "bad example" in str(caught.value)
    assert not service.ready and not children()


async def test_warm_up_results_feed_the_next_stage() -> None:
    service = Service(Stage(AddOne), Stage(Square), Stage(CountsBatches), examples=[1, 2])
    async with service:
        assert service.ready
        assert (await service.submit(3))[0] == 16


async def test_a_result_that_cannot_be_sent_back_fails_only_its_item() -> None:
    async with Service(Stage(ReturnsUnpicklable, batching=batching())) as service:
        results = await asyncio.gather(
            *(service.submit(i) for i in range(20)), return_exceptions=True
        )
        assert await service.submit(4) == 4  # the worker is fine
    for i, result in enumerate(results):
        if i % 2:
            assert isinstance(result, RemoteError) and result.type_name == "UnpicklableResult"
            assert "lock" in result.message
        else:
            assert result == i


async def test_thread_stages_batch_route_and_isolate_errors() -> None:
    service = Service(
        Stage(AddOne, mode="thread", batching=batching()),
        Stage(Picky, workers=2, mode="thread", batching=batching()),
        examples=[1],
    )
    async with service:
        assert service.ready and service.pools[1].alive == 2
        results = await asyncio.gather(
            *(service.submit(i) for i in range(200)), return_exceptions=True
        )
    for i, result in enumerate(results):
        x = i + 1
        if x % 11 == 0:
            assert isinstance(result, ArithmeticError)
        elif x % 7 == 0:
            assert isinstance(result, ValueError) and str(result) == f"{x} is a multiple of 7"
        else:
            assert result == x
    assert not service.ready


async def test_process_and_thread_stages_mix_and_arrays_stay_exact() -> None:
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((8, 32), dtype=np.float32) for _ in range(30)]
    service = Service(Stage(Identity, batching=batching()), Stage(Identity, mode="thread"))
    async with service:
        back = await asyncio.gather(*(service.submit(a) for a in arrays))
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back, strict=True))


async def test_a_thread_stage_that_cannot_set_up_fails_start() -> None:
    service = Service(Stage(RaisesInSetup, mode="thread", setup_attempts=1))
    with pytest.raises(StageFailed, match="no weights at /nowhere"):
        await service.start()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning needs Linux")
async def test_workers_are_pinned_to_their_cpus() -> None:
    last = max(os.sched_getaffinity(0))
    async with Service(Stage(ReportsCpus, cpus=[last])) as service:
        assert await service.submit(0) == [last]
    per_worker = Stage(ReportsCpus, workers=2, cpus=lambda i: [i % (last + 1)])
    async with Service(per_worker) as service:
        results = await asyncio.gather(*(service.submit(i) for i in range(40)))
    assert results and {tuple(r) for r in results} <= {(0,), (1 % (last + 1),)}


async def test_workers_get_their_own_environment_from_a_function() -> None:
    from tests.integration.pipeline_models import ReadsEnv

    stage = Stage(ReadsEnv, workers=2, env=lambda i: {"MICROBATCH_TEST_TAG": f"gpu{i}"})
    async with Service(stage) as service:
        tags = set(await asyncio.gather(*(service.submit(i) for i in range(60))))
    assert tags <= {"gpu0/ReadsEnv/0", "gpu1/ReadsEnv/1"} and tags


async def test_a_workers_math_libraries_get_its_share_of_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from microbatch.pipeline.worker_env import THREAD_VARIABLES, default_threads, usable_cores
    from tests.integration.pipeline_models import ReportsThreads

    for name in THREAD_VARIABLES:  # the spawned workers inherit this environment
        monkeypatch.delenv(name, raising=False)
    expected = default_threads(2, None, usable_cores())
    async with Service(Stage(ReportsThreads, workers=2)) as service:
        answers = set(await asyncio.gather(*(service.submit(i) for i in range(20))))
    assert answers == {(str(expected), expected)}
    if usable_cores() < 2:
        return  # OpenBLAS starts no more threads than cores: 2 could not be told apart
    # the stage's own count holds for numpy, which its model's module imported first
    async with Service(Stage(ReportsThreads, env={"OPENBLAS_NUM_THREADS": "2"})) as service:
        assert await service.submit(0) == (None, 2)


async def test_close_lets_the_items_inside_finish() -> None:
    stage = Stage(Slow, batching=batching(max_latency_ms=0, max_batch_size=2), args=(0.1,))
    service = Service(stage)
    await service.start()
    calls = [asyncio.create_task(service.submit(i)) for i in range(6)]
    await eventually(lambda: service.stats().in_flight == 6)  # all six are inside
    await service.close()
    assert [r[0] for r in await asyncio.gather(*calls)] == list(range(6))
    with pytest.raises(BatcherClosed):
        await service.submit(9)
    assert not children()


async def test_close_after_the_grace_period_answers_what_is_still_queued(tmp_path: Path) -> None:
    beacon = Beacon(tmp_path)
    settings = batching(max_latency_ms=0, max_batch_size=1)
    service = Service(Stage(Signalled, batching=settings, args=beacon.args), grace_s=0.05)
    await service.start()
    async with beacon:
        calls = [asyncio.create_task(service.submit(i)) for i in range(5)]
        assert await beacon.started() == [0]  # the worker holds 0, and 1 in its pipe
        await eventually(lambda: service.stats().stages[0].batching.queued == 3)
        closing = asyncio.create_task(service.close())
        async with asyncio.timeout(30):  # the grace period passes: the queue is answered
            await asyncio.wait(calls[BATCHES_PER_WORKER:])
        beacon.let_go()
    await closing
    results = await asyncio.gather(*calls, return_exceptions=True)
    # The worker finishes what it holds: the running batch and the next, in its pipe.
    assert [r[0] for r in results[:BATCHES_PER_WORKER]] == list(range(BATCHES_PER_WORKER))
    assert all(isinstance(r, BatcherClosed) for r in results[BATCHES_PER_WORKER:])
    assert not children()


async def test_submit_before_start_is_refused_at_once() -> None:
    with pytest.raises(BatcherClosed, match="not started"):
        await Service(Stage(Identity)).submit(1)


async def test_a_stage_whose_workers_cannot_set_up_fails_fast_then_recovers(tmp_path: Path) -> None:
    marker = tmp_path / "broken"
    stage = Stage(SetsUpUnlessMarked, args=(str(marker),), setup_attempts=2)
    async with Service(stage) as service:
        assert await service.submit(1) == 1
        marker.touch()  # from now on every restart dies in setup
        (pid,) = service.pools[0].pids
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: not service.ready)
        with pytest.raises(StageFailed, match="no live worker"):
            await service.submit(2)  # at once, while the worker starts again
        await eventually(lambda: service.pools[0].failure is not None)
        assert not service.ready
        with pytest.raises(StageFailed, match="died 2 times in setup"):
            await service.submit(3)  # at once, with the reason
        # A fresh error for each batch: one instance raised in every caller would
        # grow its traceback for as long as the outage lasts.
        (first,), (second,) = [await outcomes(service.pools[0], [x]) for x in (5, 6)]
        assert isinstance(first, StageFailed) and first is not second
        marker.unlink()  # the cause is fixed: the next restart, after a pause, succeeds
        await eventually(lambda: service.ready, timeout_s=20)
        assert await service.submit(4) == 4
    assert not children()


def test_a_model_defined_in_a_function_is_refused_with_a_clear_reason() -> None:
    class Local(Model):
        def predict(self, batch: list[int]) -> list[int]:
            return batch

    with pytest.raises(TypeError, match="define it at module level"):
        Stage(Local)
    Stage(Local, mode="thread")  # threads need no pickling


def test_arguments_that_do_not_pickle_are_refused_with_a_clear_reason() -> None:
    with pytest.raises(TypeError, match="must pickle"):
        Stage(Identity, args=(threading.Lock(),))


def test_stage_shortcuts_and_thread_only_options() -> None:
    stage = Stage(Identity, workers=3, max_batch_size=5, max_latency_ms=7)
    assert (stage.config.max_batch_size, stage.config.max_latency_ms) == (5, 7)
    assert stage.config.max_concurrent_batches == 3
    with pytest.raises(ValueError, match="not to mode='thread'"):
        Stage(Identity, mode="thread", cpus=[0])


async def test_a_model_the_worker_cannot_import_is_a_setup_failure_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "vanishing_model.py"
    module.write_text(
        "from microbatch import Model\n\n"
        "class Vanishing(Model):\n"
        "    def predict(self, batch):\n"
        "        return batch\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    vanishing_model = importlib.import_module("vanishing_model")
    stage = Stage(vanishing_model.Vanishing, setup_attempts=1)
    module.unlink()  # importable here, gone for the spawned worker
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
    with pytest.raises(StageFailed, match=r"ModuleNotFoundError.*vanishing_model"):
        await Service(stage).start()
    assert not children()


async def test_items_whose_callers_left_are_not_computed_by_the_next_stage(
    tmp_path: Path,
) -> None:
    from tests.integration.pipeline_models import Recorder

    Recorder.seen = []
    beacon = Beacon(tmp_path)
    first = Stage(Signalled, batching=batching(max_latency_ms=0), args=beacon.args)
    async with Service(first, Stage(Recorder, mode="thread")) as service, beacon:
        calls = [asyncio.create_task(service.submit(i, timeout_s=5)) for i in range(6)]
        await beacon.started()  # the worker holds the first batch

        def all_in_the_first_stage() -> bool:
            stage = service.stats().stages[0].batching
            return stage.queued + stage.in_flight == 6

        await eventually(all_in_the_first_stage)
        for i in (1, 3, 5):
            calls[i].cancel()
        late = asyncio.create_task(service.submit(6, timeout_s=0.1))
        await asyncio.wait([late])  # it expires: the worker is busy
        beacon.let_go()
        outcomes = await asyncio.gather(*calls, late, return_exceptions=True)
    assert [o[0] for i, o in enumerate(outcomes[:6]) if i % 2 == 0] == [0, 2, 4]
    assert all(isinstance(outcomes[i], asyncio.CancelledError) for i in (1, 3, 5))
    assert isinstance(outcomes[6], DeadlineExceeded)
    assert sorted(item[0] for item in Recorder.seen) == [0, 2, 4]


async def test_an_item_that_expires_while_its_batch_waits_for_a_worker_is_not_computed() -> None:
    from tests.integration.pipeline_models import Recorder, SlowRecorder

    Recorder.seen = []
    stage = Stage(
        SlowRecorder,
        mode="thread",
        batching=batching(max_latency_ms=0, max_batch_size=1),
        args=(0.2,),
    )
    async with Service(stage) as service:
        first = asyncio.create_task(service.submit(0))
        await eventually(lambda: Recorder.seen == [0])
        due = asyncio.get_running_loop().time() + 0.3  # 0 ends at 0.2, 1 at 0.4
        # When 0 finishes, 1 starts, 2 is handed to the stage to wait for the model
        # (run ahead) and expires there; 3 expires in the queue.
        late = [asyncio.create_task(service.submit(i, deadline=due)) for i in (1, 2, 3)]
        outcomes = await asyncio.gather(first, *late, return_exceptions=True)
        await eventually(lambda: service.stats().stages[0].batching.in_flight == 0)
    assert outcomes[0] == 0
    assert all(isinstance(outcome, DeadlineExceeded) for outcome in outcomes[1:])
    assert Recorder.seen == [0, 1]


def zombies() -> int:
    """Exited child processes of this test process that nobody has reaped."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            count += int(fields[1]) == os.getpid() and fields[0] == "Z"
    return count


def serving_workers(pool: ProcessPool) -> int:
    """The pool's workers that are alive and take batches, each one looked at."""
    return sum(1 for w in pool._workers if w is not None and w.alive and w.serving)


async def test_a_dead_worker_is_reaped_at_once_not_kept_until_close() -> None:
    # Its sentinel may fire a moment before it has exited; it used to be kept, with
    # a zombie and its descriptors, until the pool closed (one more per crash).
    async with Service(Stage(Identity, workers=2)) as service:
        pool = service.pools[0]
        assert await service.submit(1) == 1
        baseline = len(os.listdir("/proc/self/fd"))
        for _ in range(8):
            victim = pool.pids[0]
            os.kill(victim, signal.SIGKILL)
            # the count kept as workers change is the one a look at each worker gives
            assert pool.alive == serving_workers(pool)
            await eventually(lambda v=victim: v not in pool.pids and pool.alive == 2)  # type: ignore[misc]
            assert pool.alive == serving_workers(pool)
            await eventually(lambda: not zombies() and len(os.listdir("/proc/self/fd")) <= baseline)
    assert pool.alive == serving_workers(pool) == 0  # closed


async def test_a_pool_asked_to_run_before_its_warm_up_fails_fast() -> None:
    pool = ProcessPool(Stage(Identity))
    await pool.start()
    try:
        (outcome,) = await asyncio.wait_for(outcomes(pool, [1]), timeout=10)
        assert isinstance(outcome, StageFailed) and "before warm_up" in str(outcome)
        await pool.warm_up([])
        assert await outcomes(pool, [1]) == [1]
    finally:
        await pool.close()
