"""Large buffers through the workers' shared-memory arenas: exact results, slots that
are never overwritten while read, and no file left in /dev/shm, whoever dies."""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import random
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch import BatchConfig
from microbatch.errors import RemoteError, WorkerDied
from microbatch.pipeline import ProcessPool, Service, Stage
from microbatch.pipeline.arena import ARENA_MIN_BYTES, SHM_DIR
from tests.integration.jobs import outcomes
from tests.integration.pipeline_models import (
    Identity,
    ReturnsWorkerOnlyClass,
    Reverse,
    Slow,
    SlowSetup,
)
from tests.integration.test_pipeline_lifecycle import eventually
from tests.unit.test_transport import SIZES, array, same

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm"),
]

EDGE = ARENA_MIN_BYTES
MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def names(pid: int | None = None) -> set[str]:
    """The arena names in /dev/shm of the serving process ``pid`` (default: this one)."""
    return {path.name for path in SHM_DIR.glob(f"microbatch-{pid or os.getpid()}-*")}


def arena_files() -> dict[int, int]:
    """The arena files this process holds open, unlinked or not (through a descriptor,
    or the one each mapping keeps): inode -> size."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{SHM_DIR}/microbatch-{os.getpid()}-"):
                info = os.fstat(int(fd))
                found[info.st_ino] = info.st_size
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return found


def exact(sent: Any, got: Any) -> bool:
    if isinstance(sent, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and (got.dtype, got.shape) == (sent.dtype, sent.shape)
            and got.tobytes() == sent.tobytes()
            and got.flags.writeable
        )
    return type(got) is type(sent) and got == sent


def payloads() -> list[Any]:
    """Arrays and bytes just under, at and over the threshold, and large."""
    rng = np.random.default_rng(7)
    items: list[Any] = []
    for size in (EDGE - 8, EDGE, EDGE + 8, MIB, 8 * MIB):
        items.append(rng.integers(0, 255, size, dtype=np.uint8))
        items.append(rng.standard_normal(size // 8).astype(">f8"))
        items.append(rng.bytes(size))
    return items


async def test_arrays_and_bytes_around_the_threshold_and_large_come_back_exact() -> None:
    items = payloads()
    settings = BatchConfig(max_batch_size=3, max_latency_ms=1)
    async with Service(Stage(Reverse, workers=2, batching=settings)) as service:
        results = await asyncio.gather(*(service.submit(item) for item in items))
        # Both ways, 8 MiB items went through the arena (results over 4 MiB are
        # copied out on a thread, smaller ones on the event loop).
        assert sum(size >= 8 * MIB for size in arena_files().values()) >= 2
    for item, result in zip(items, results, strict=True):
        assert exact(item[::-1], result)
    assert not names() and not arena_files()


async def test_many_batches_two_in_flight_per_worker_each_caller_keeps_its_own() -> None:
    rng = np.random.default_rng(11)
    sizes = rng.integers(EDGE // 2, 2 * MIB, 160)
    items = [np.full(int(size), i % 251, np.uint8) for i, size in enumerate(sizes)]
    batches = [items[i : i + 4] for i in range(0, len(items), 4)]
    pool = ProcessPool(Stage(Reverse, workers=2))
    await pool.start()
    await pool.warm_up([])
    try:
        results = await asyncio.gather(*(outcomes(pool, batch) for batch in batches))
        # Both workers held two batches at once: all their slots carried data both ways.
        assert len(arena_files()) == 8 and all(arena_files().values())
        more = await asyncio.gather(*(outcomes(pool, [item + 1]) for item in items[:40]))
    finally:
        await pool.close()
    # Results kept from earlier batches were not touched by the batches after them.
    for i, result in enumerate(itertools.chain.from_iterable(results)):
        assert result.shape == items[i].shape and (result == i % 251).all()
        result += 1  # and they are the caller's own, writable
    assert all((m == (i % 251) + 1).all() for i, (m,) in enumerate(more))
    assert not names() and not arena_files()


async def test_a_worker_killed_mid_batch_leaks_nothing_and_the_pool_recovers() -> None:
    big = np.arange(3 * MIB, dtype=np.uint8)
    stage = Stage(Slow, batching=BatchConfig(max_batch_size=2, max_latency_ms=0), args=(0.5,))
    async with Service(stage) as service:
        pool = service.pools[0]
        (victim,) = pool.pids
        held = set(arena_files())
        assert len(held) == 4 and not names()  # opened by the worker, unlinked
        calls = [asyncio.create_task(service.submit(big + i)) for i in range(4)]
        await asyncio.sleep(0.2)
        os.kill(victim, signal.SIGKILL)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert any(isinstance(outcome, WorkerDied) for outcome in outcomes)
        await eventually(lambda: pool.alive == 1)
        # The dead worker's files are closed (its memory freed); its successor's are open.
        assert not held & set(arena_files()) and len(arena_files()) == 4
        item, pid, _ = await service.submit(big)
        assert pid != victim and np.array_equal(item, big)
    assert not names() and not arena_files()


async def test_names_live_only_while_a_worker_sets_up_and_close_leaves_nothing() -> None:
    service = Service(Stage(SlowSetup, workers=2, args=(1.0,)))
    starting = asyncio.create_task(service.start())
    await eventually(lambda: len(names()) == 8)  # 2 workers x 2 slots x 2 ways
    for name in names():
        info = os.stat(SHM_DIR / name)
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    await starting
    assert not names() and len(arena_files()) == 8
    assert await service.submit(b"x" * 5 * MIB) == b"x" * 5 * MIB
    await service.close()
    assert not names() and not arena_files()


async def test_a_killed_serving_process_leaves_no_names_behind() -> None:
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.shm_server",
        "2",
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await eventually(lambda: len(names(server.pid)) == 8, timeout_s=30)
    finally:
        server.kill()  # while its workers set up: nobody has unlinked their files yet
        await server.wait()
    # Multiprocessing's resource tracker unlinks them once the workers are gone too
    # (they notice when they finish setting up).
    await eventually(lambda: not names(server.pid), timeout_s=60)


@pytest.mark.parametrize("size", [10, 6 * MIB], ids=["on the loop", "on a thread"])
async def test_a_result_the_serving_process_cannot_read_fails_its_items_only(size: int) -> None:
    async with Service(Stage(ReturnsWorkerOnlyClass)) as service:
        with pytest.raises(RemoteError, match="cannot be read") as caught:
            await service.submit(b"y" * size)
        assert caught.value.type_name == "ModuleNotFoundError"
        with pytest.raises(RemoteError, match="cannot be read"):  # the worker still serves
            await service.submit(b"z")


@pytest.fixture(scope="module")
def run_batches() -> Iterator[Callable[[list[list[Any]]], list[list[Any]]]]:
    """Runs batches at once through a two-worker pool that lives on an event loop of
    its own (hypothesis drives plain functions)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=60)

    async def run(batches: list[list[Any]]) -> list[list[Any]]:
        return await asyncio.gather(*(outcomes(pool, batch) for batch in batches))

    pool = ProcessPool(Stage(Identity, workers=2))
    call(pool.start())
    call(pool.warm_up([]))
    yield lambda batches: call(run(batches))
    call(pool.close())
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


sizes = st.sampled_from([*SIZES, 5 * MIB]) | st.integers(0, 3 * EDGE)
leaves = st.builds(
    array,
    sizes,
    st.sampled_from(["u1", "f4", ">f8"]),
    st.sampled_from(["flat", "fortran", "strided"]),
    st.integers(0, 2**32 - 1),
) | st.builds(lambda n, seed: random.Random(seed).randbytes(n), sizes, st.integers())
batches = st.lists(st.lists(leaves | st.tuples(leaves, leaves), min_size=1, max_size=4), max_size=5)


@settings(max_examples=25, deadline=None)
@given(sent=batches)
def test_any_mix_of_buffer_sizes_round_trips_through_workers_byte_exact(
    run_batches: Callable[[list[list[Any]]], list[list[Any]]], sent: list[list[Any]]
) -> None:
    got = run_batches(sent)  # up to 5 batches at once: two in flight per worker
    assert same(pickle.loads(pickle.dumps(sent, protocol=5)), got)
