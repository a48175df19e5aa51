"""Streams from a worker process: the states stay in the worker, the chunks come
back; a worker that dies ends its streams with WorkerDied and the next stream gets
a fresh worker."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from microbatch import ItemError, RemoteError, Service, Stage, WorkerDied
from microbatch.pipeline.step_worker import ProcessStepRunner
from microbatch.step_contract import StepJob

from .models import Counter, Echo, Lockstep, Slow


async def test_chunks_stream_back_from_a_worker_process() -> None:
    async with Service(Stage(Counter, max_batch_size=4)) as service:
        results = await asyncio.gather(
            *(service.submit(f"p{i}:{i + 1}") for i in range(6)),
        )
        assert results == [[f"p{i}-{k}" for k in range(i + 1)] for i in range(6)]
        with pytest.raises(ItemError, match="bad failed at step 1"):
            await service.submit("bad:3:fail@1")
        pid = await service.stream("pid").__anext__()
        assert pid != os.getpid() and pid in service.pools[0].pids


async def test_a_dead_worker_ends_its_streams_with_an_error() -> None:
    async with Service(Stage(Counter, max_batch_size=4)) as service:
        endless = [service.stream("pid") for _ in range(3)]
        pids = {await stream.__anext__() for stream in endless}
        assert len(pids) == 1
        os.kill(pids.pop(), signal.SIGKILL)
        for stream in endless:
            with pytest.raises(WorkerDied):
                async for _ in stream:
                    pass
        assert await service.submit("after:2") == ["after-0", "after-1"]
        assert service.stats().stages[0].restarts == 1


async def test_lockstep_in_a_worker_process() -> None:
    async with Service(Stage(Lockstep, max_batch_size=4)) as service:
        assert await service.submit(3) == [0, 1, 2]


async def test_idempotent_steps_restart_on_a_fresh_worker_without_repeating_chunks() -> None:
    async with Service(Stage(Slow, max_batch_size=4, idempotent=True)) as service:
        stream = service.stream(30)
        received = [await stream.__anext__() for _ in range(3)]
        os.kill(service.pools[0].pids[0], signal.SIGKILL)
        received += [chunk async for chunk in stream]
        assert received == list(range(30))
        assert service.stats().stages[0].restarts == 1


async def test_a_worker_that_died_while_idle_fails_no_new_stream() -> None:
    async with Service(Stage(Counter, max_batch_size=4)) as service:
        pid = service.pools[0].pids[0]
        os.kill(pid, signal.SIGKILL)
        await asyncio.get_running_loop().run_in_executor(None, _wait_gone, pid)
        assert await service.submit("new:2") == ["new-0", "new-1"]
        assert service.pools[0].pids[0] != pid


def _wait_gone(pid: int) -> None:
    """Until the killed worker is reaped or a zombie (bounded)."""
    for _ in range(500):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(")")[1].split()[0] == "Z":
                    return
        except (FileNotFoundError, ProcessLookupError):  # reaped, maybe mid-read
            return
        time.sleep(0.01)


async def test_the_worker_takes_a_step_when_it_is_handed_over_not_when_awaited(
    tmp_path: Path,
) -> None:
    # So the worker computes a step while the loop hands out the last one's chunks.
    mark = tmp_path / "started"
    runner = ProcessStepRunner(Stage(Echo, kwargs={"mark": str(mark)}), 0)
    await runner.start()
    try:
        answer = runner.advance(StepJob((7,), (b"ab",)))
        # The event loop does not turn while this waits: only a job written by
        # advance() itself can reach the worker.
        assert _appears(mark)
        done = await answer
        assert (done.keys, done.chunks, done.finished) == ([7], [b"ab"], [False])
        done = await runner.advance(StepJob())
        assert (done.keys, done.chunks, done.finished) == ([7], [b"ba"], [True])
    finally:
        await runner.close()
    assert runner.pids == []


async def test_items_and_chunks_larger_than_a_pipe_holds_cross_whole() -> None:
    items = [os.urandom(512 * 1024) + bytes([i]) for i in range(8)]  # 4 MiB in one job
    async with Service(Stage(Echo, max_batch_size=8, min_joiners=8)) as service:
        results = await asyncio.gather(*(service.submit(item) for item in items))
    assert results == [[item, item[::-1]] for item in items]


async def test_an_item_or_a_chunk_that_does_not_pickle_fails_alone() -> None:
    async with Service(Stage(Counter, max_batch_size=8, min_joiners=3)) as service:
        outcomes = await asyncio.gather(
            service.submit("ok:3"),
            service.submit(threading.Lock()),
            service.submit("lock:2"),
            return_exceptions=True,
        )
        assert outcomes[0] == ["ok-0", "ok-1", "ok-2"]
        assert isinstance(outcomes[1], Exception) and "pickle" in str(outcomes[1])
        assert isinstance(outcomes[2], Exception) and "cannot be sent back" in str(outcomes[2])
        assert await service.submit("after:1") == ["after-0"]
        assert service.stats().stages[0].restarts == 0


async def test_chunks_that_cannot_be_read_here_fail_their_step_and_nothing_hangs() -> None:
    async with Service(Stage(Counter, max_batch_size=4)) as service:
        pid = service.pools[0].pids[0]
        with pytest.raises(RemoteError, match="cannot be read: no module named 'elsewhere'"):
            await service.submit("alien:2")
        assert await service.submit("after:2") == ["after-0", "after-1"]
        assert service.pools[0].pids[0] != pid  # its states went with the step


class _PicklesOnSecondTry:
    """An item whose first pickling fails and whose next ones do not (the step's
    whole job fails to pickle, yet no item alone is to blame)."""

    tries = 0

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        type(self).tries += 1
        if type(self).tries == 1:
            raise RuntimeError("not yet")
        return (str, ("late:1",))


async def test_a_step_that_cannot_be_sent_fails_and_the_worker_is_replaced() -> None:
    async with Service(Stage(Counter, max_batch_size=4)) as service:
        pid = service.pools[0].pids[0]
        with pytest.raises(RuntimeError, match="not yet"):
            await service.submit(_PicklesOnSecondTry())
        assert await service.submit("after:1") == ["after-0"]
        assert service.pools[0].pids[0] != pid


def _appears(path: Path) -> bool:
    """Whether ``path`` exists within 30 s (a blocking wait: the loop stays still)."""
    for _ in range(3000):
        if path.exists():
            return True
        time.sleep(0.01)
    return False
