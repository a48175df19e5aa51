"""Process stages (issue 3): transport overhead, pipe vs shared memory, served accelerator.

Table 1, per-batch transport overhead (us per batch, round trip). Payloads: 64 ints,
one item holding a 64x256 float32 array (64 KiB), and 64 items of one 256-float32 row
each. Paths: a direct in-process call of the model; a bare pipe echo with
``pipeline/transport.py`` (blocking, no event loop: the pure transport; buffers under
64 KiB pickled in band); the same with the transport before the arena (every buffer
a pipe frame of its own); ``ProcessPool.run`` (transport plus event-loop wake-up);
``Service`` with 64 concurrent ``submit`` calls (plus batch formation).

Table 2, round trip of one float32 array to a process and back, 64 KiB to 64 MiB.
Bare echoes (blocking, no event loop): ``transport.py`` without an arena (buffers as
pipe frames, copied out on receipt); the transport before the arena (frames used
as they arrive: read-only arrays, one copy less); ``transport.py`` with the
worker arena (``arena.py``: the array goes through reused shared-memory files,
both sides copy out what they receive); and ``multiprocessing.shared_memory`` by
hand: a fresh segment per message each way, and two reused segments (the echo
copies slot to slot, only the caller copies out). Then ``ProcessPool.run`` with one
item (the array), with and without the arena. The caller owns its result.

Table 2b, the same ``ProcessPool.run`` round trip with the arena, the result copied
out on the event loop vs on a thread (``pool._COPY_ON_THREAD_BYTES``): the round
trip, and how long the loop spent in one result's receive (median, max).

Table 3, the simulated accelerator (``time.sleep(0.002 + 0.00002 * n)``, max batch 64,
max wait 10 ms) at 16, 64 and 256 closed-loop asyncio callers, fixed duration after a
warm-up: (a) the in-process ``Batcher``, (b) a ``Service`` with one process stage,
(c) mpservice's ``ProcessServlet`` + ``AsyncServer`` (``batch_size=64``,
``batch_wait_time=0.01``) when installed. Ratios (b)/(a) and (b)/(c).

Run (the venv as in the README, plus mpservice)::

    python3 -m venv .venv-bench && .venv-bench/bin/pip install -e . numpy mpservice
    .venv-bench/bin/python benchmarks/pipeline.py            # about 3 minutes
    .venv-bench/bin/python benchmarks/pipeline.py --quick    # smoke run

Writes ``benchmarks/results/pipeline.json`` (with ``--skip``, the skipped tables keep
their results from the last run). Timings on a shared machine are noisy: the ratios
within one run are what count.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import pickle
import platform
import statistics
import struct
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, nullcontext, suppress
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

import microbatch
from microbatch import BatchConfig, Batcher, Model, Service, Stage
from microbatch.pipeline import ProcessPool
from microbatch.pipeline import pool as pool_module
from microbatch.pipeline import processes as processes_module
from microbatch.pipeline.arena import Arena
from microbatch.pipeline.transport import read_message, receive, send
from microbatch.types import BatchJob

try:
    from mpservice import mpserver
    from mpservice.multiprocessing import MP_SPAWN_CTX
except ImportError as error:  # the table then has no mpservice rows
    print(f"(mpservice not importable: {error})", file=sys.stderr)
    mpserver = None

RESULTS = Path(__file__).resolve().parent / "results" / "pipeline.json"
BATCH = 64
LATENCY_MS = 10.0
SPAWN = get_context("spawn")
MIB = 1 << 20


def accelerator_delay_s(n: int) -> float:
    """The simulated accelerator's time for a batch of ``n``: 2 ms + 20 us per item."""
    return 0.002 + 0.00002 * n


# -- models (importable by spawned workers) ----------------------------------------


class Identity(Model):
    """Returns its batch: the trivial model."""

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class Accelerator(Model):
    """Sleeps like an accelerator busy with the batch, then returns the items."""

    def predict(self, batch: list[Any]) -> list[Any]:
        time.sleep(accelerator_delay_s(len(batch)))
        return batch


def accelerate(batch: list[Any]) -> list[Any]:
    """The accelerator as a plain batch function (the in-process contender)."""
    time.sleep(accelerator_delay_s(len(batch)))
    return batch


if mpserver is not None:

    class MpsAccelerator(mpserver.Worker):
        """The accelerator as an mpservice worker; counts batches and items."""

        def __init__(self, *, counters: Any, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.counters = counters

        def call(self, batch: list[Any]) -> list[Any]:
            time.sleep(accelerator_delay_s(len(batch)))
            with self.counters.get_lock():
                self.counters[0] += 1
                self.counters[1] += len(batch)
            return batch


# -- child processes for the raw transport tables ------------------------------------


_HEAD = struct.Struct("<I")


def send_before(conn: Connection, message: Any) -> None:
    """The transport before the arena: every out-of-band buffer a pipe frame."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    conn.send_bytes(_HEAD.pack(len(buffers)) + body)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def receive_before(conn: Connection) -> Any:
    """Receive what :func:`send_before` sent; the frames become the buffers, uncopied."""
    head = conn.recv_bytes()
    (count,) = _HEAD.unpack_from(head)
    buffers = [conn.recv_bytes() for _ in range(count)]
    return pickle.loads(memoryview(head)[_HEAD.size :], buffers=buffers)


def before_echo(conn: Connection) -> None:
    """Child: send every message back with the transport before the arena."""
    while (message := receive_before(conn)) is not None:
        send_before(conn, message)


def arena_echo(conn: Connection, names: tuple[str, ...]) -> None:
    """Child: like a worker, copy each message out of the arena and send it back
    through the arena (slot 0); stop at the message without a slot."""
    arena = Arena.attach(names)
    while (message := read_message(conn)).slot is not None:
        slot = message.slot
        send(conn, message.decode(arena.incoming(slot)), slot, arena.outgoing(slot))


def pipe_echo(conn: Connection) -> None:
    """Child: send every message back until ``None`` (no arena: pipe frames)."""
    while (message := receive(conn)) is not None:
        send(conn, message)


def shm_fresh_echo(conn: Connection) -> None:
    """Child: for each (name, shape, dtype), copy the array into a new segment, send its name."""
    while (message := receive(conn)) is not None:
        name, shape, dtype = message
        incoming = SharedMemory(name=name)
        source = np.ndarray(shape, dtype, buffer=incoming.buf)
        out = SharedMemory(create=True, size=max(1, source.nbytes))
        np.copyto(np.ndarray(shape, dtype, buffer=out.buf), source)
        del source
        incoming.close()
        send(conn, (out.name, shape, dtype))
        out.close()  # the parent unlinks it once read (spawned children share one tracker)


def shm_reused_echo(conn: Connection, in_name: str, out_name: str) -> None:
    """Child: for each (shape, dtype), copy the in-slot into the out-slot and reply."""
    incoming, out = SharedMemory(name=in_name), SharedMemory(name=out_name)
    while (message := receive(conn)) is not None:
        shape, dtype = message
        np.copyto(
            np.ndarray(shape, dtype, buffer=out.buf), np.ndarray(shape, dtype, buffer=incoming.buf)
        )
        send(conn, message)
    incoming.close()
    out.close()


def accelerator_worker(conn: Connection) -> None:
    """Child: run the accelerator on every batch until ``None`` (the floor's worker)."""
    while (batch := receive(conn)) is not None:
        send(conn, accelerate(batch))


@contextmanager
def child(
    target: Callable[..., None],
    *args: Any,
    stop: Callable[[Connection, Any], None] = send,
) -> Iterator[Connection]:
    """A spawned child running ``target(conn, *args)``; stopped on exit by ``None``,
    sent with ``stop`` (the child's transport)."""
    parent, other = SPAWN.Pipe(duplex=True)
    process = SPAWN.Process(target=target, args=(other, *args), daemon=True)
    process.start()
    other.close()
    try:
        yield parent
    finally:
        with suppress(OSError):  # the child is gone already
            stop(parent, None)
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
        parent.close()


# -- timing helpers -----------------------------------------------------------------


def time_blocks(
    contenders: dict[str, Callable[[], Any]], calls: int, blocks: int
) -> dict[str, float]:
    """Median over ``blocks`` of the mean seconds per call, contenders interleaved."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(blocks):
        for name, call in contenders.items():
            gc.collect()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


async def atime_blocks(
    contenders: dict[str, Callable[[], Awaitable[Any]]], calls: int, blocks: int
) -> dict[str, float]:
    """:func:`time_blocks` for coroutine functions."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(blocks):
        for name, call in contenders.items():
            gc.collect()
            start = time.perf_counter()
            for _ in range(calls):
                await call()
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of a sorted list (nearest rank)."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


# -- table 1: per-batch overhead ----------------------------------------------------


def payloads() -> dict[str, list[Any]]:
    """The batches of table 1, by name."""
    rng = np.random.default_rng(0)
    array = rng.standard_normal((BATCH, 256), dtype=np.float32)
    return {
        "64 ints": list(range(BATCH)),
        "1 item: 64x256 f32": [array],
        "64 items: 256 f32 row": [row.copy() for row in array],
    }


def overhead_sync(batch: list[Any], calls: int, blocks: int) -> dict[str, float]:
    """Direct call and bare pipe echoes (the transport now, and before the arena)."""
    model = Identity()
    with child(pipe_echo) as plain, child(before_echo, stop=send_before) as before:

        def plain_trip() -> Any:
            send(plain, batch)
            return receive(plain)

        def before_trip() -> Any:
            send_before(before, batch)
            return receive_before(before)

        _check_same(plain_trip(), batch)
        _check_same(before_trip(), batch)
        return time_blocks(
            {
                "direct call": lambda: model.predict(batch),
                "bare pipe (transport.py)": plain_trip,
                "bare pipe, before the arena": before_trip,
            },
            calls,
            blocks,
        )


async def overhead_async(batch: list[Any], calls: int, blocks: int) -> dict[str, Any]:
    """``ProcessPool.run`` and a ``Service`` fed 64 concurrent submissions."""
    stage = Stage(Identity, workers=1, batching=BatchConfig(max_batch_size=BATCH))
    pool = ProcessPool(stage)
    service = Service(Stage(Identity, workers=1, batching=BatchConfig(max_batch_size=BATCH)))
    await pool.start()
    await pool.warm_up([])  # no examples: the workers take batches from now on
    await service.start()
    try:
        _check_same(await run_items(pool, batch), batch)

        async def submit_all() -> list[Any]:
            return await asyncio.gather(*(service.submit(item) for item in batch))

        _check_same(await submit_all(), batch)
        before = service.stats().stages[0].batching
        times = await atime_blocks(
            {
                "ProcessPool.run": lambda: run_items(pool, batch),
                "Service, len(batch) submits": submit_all,
            },
            calls,
            blocks,
        )
        after = service.stats().stages[0].batching
        mean = (after.items - before.items) / max(1, after.batches - before.batches)
        return {**times, "service_mean_batch": mean}
    finally:
        await pool.close()
        await service.close()


def _check_same(got: list[Any], want: list[Any]) -> None:
    if len(got) != len(want) or not all(
        np.array_equal(g, w) if isinstance(w, np.ndarray) else g == w
        for g, w in zip(got, want, strict=True)
    ):
        raise AssertionError("a round trip changed the batch")


def table_overhead(calls: int, blocks: int) -> dict[str, dict[str, float]]:
    """Table 1: us per batch for every payload and path."""
    rows: dict[str, dict[str, float]] = {}
    for name, batch in payloads().items():
        row = overhead_sync(batch, calls, blocks)
        row.update(asyncio.run(overhead_async(batch, calls, blocks)))
        rows[name] = {
            key: (value * 1e6 if key != "service_mean_batch" else value)
            for key, value in row.items()
        }
    return rows


# -- table 2: pipe vs shared memory --------------------------------------------------


def pipe_trip(conn: Connection, array: np.ndarray) -> np.ndarray:
    """One round trip through the current transport, no arena (pipe frames)."""
    send(conn, array)
    result: np.ndarray = receive(conn)
    return result


def before_trip(conn: Connection, array: np.ndarray) -> np.ndarray:
    """One round trip through the transport before the arena."""
    send_before(conn, array)
    result: np.ndarray = receive_before(conn)
    return result


def arena_trip(conn: Connection, array: np.ndarray, arena: Arena) -> np.ndarray:
    """One round trip through the current transport and the arena (slot 0)."""
    send(conn, array, 0, arena.outgoing(0))
    result: np.ndarray = read_message(conn).decode(arena.incoming(0))
    return result


def shm_fresh_trip(conn: Connection, array: np.ndarray) -> np.ndarray:
    """Copy into a new segment, child copies into another new one, copy out, unlink both."""
    segment = SharedMemory(create=True, size=array.nbytes)
    try:
        np.copyto(np.ndarray(array.shape, array.dtype, buffer=segment.buf), array)
        send(conn, (segment.name, array.shape, array.dtype.str))
        name, shape, dtype = receive(conn)
        reply = SharedMemory(name=name)
        result = np.ndarray(shape, dtype, buffer=reply.buf).copy()
        reply.close()
        reply.unlink()
        return result
    finally:
        segment.close()
        segment.unlink()


def shm_reused_trip(
    conn: Connection, array: np.ndarray, slots: tuple[SharedMemory, SharedMemory]
) -> np.ndarray:
    """Copy into the in-slot; the child copies into the out-slot; copy the result out."""
    incoming, out = slots
    np.copyto(np.ndarray(array.shape, array.dtype, buffer=incoming.buf), array)
    send(conn, (array.shape, array.dtype.str))
    shape, dtype = receive(conn)
    return np.ndarray(shape, dtype, buffer=out.buf).copy()


async def table_shm(sizes: list[int], budget_s: float, blocks: int) -> dict[str, Any]:
    """Table 2: ms per round trip for each size and path (contenders interleaved)."""
    largest = max(sizes)
    slots = (SharedMemory(create=True, size=largest), SharedMemory(create=True, size=largest))
    arena = Arena.create(1)
    if arena is None:
        raise RuntimeError("no /dev/shm here: the arena cannot be measured")
    rows: dict[str, dict[str, float]] = {}
    try:
        with (
            child(pipe_echo) as pipe_conn,
            child(before_echo, stop=send_before) as before_conn,
            child(arena_echo, arena.names) as arena_conn,
            child(shm_fresh_echo) as fresh_conn,
            child(shm_reused_echo, slots[0].name, slots[1].name) as reused_conn,
        ):
            async with (
                running_pool(arena=True) as with_arena,
                running_pool(arena=False) as without_arena,
            ):
                for size in sizes:
                    array = np.arange(size // 4, dtype=np.float32)
                    contenders = {
                        "pipe frames (transport.py)": aio(pipe_trip, pipe_conn, array),
                        "pipe frames, before the arena": aio(before_trip, before_conn, array),
                        "arena (transport.py)": aio(arena_trip, arena_conn, array, arena),
                        "shm by hand, fresh segments": aio(shm_fresh_trip, fresh_conn, array),
                        "shm by hand, reused segments": aio(
                            shm_reused_trip, reused_conn, array, slots
                        ),
                        "ProcessPool.run, pipe frames": first(without_arena, array),
                        "ProcessPool.run, arena": first(with_arena, array),
                    }
                    for call in contenders.values():
                        if not np.array_equal(await call(), array):
                            raise AssertionError("a round trip changed the array")
                    once = await atime_blocks(contenders, 1, 1)
                    calls = max(1, int(budget_s / blocks / max(once.values()) / len(contenders)))
                    times = await atime_blocks(contenders, calls, blocks)
                    rows[_size_name(size)] = {name: t * 1e3 for name, t in times.items()}
                    print(f"  {_size_name(size)}: {calls} calls x {blocks} blocks", flush=True)
    finally:
        arena.close()
        for segment in slots:
            segment.close()
            segment.unlink()
    return rows


def aio(trip: Callable[..., np.ndarray], *args: Any) -> Callable[[], Awaitable[np.ndarray]]:
    """A blocking round trip as a coroutine function, to interleave with the pools."""

    async def call() -> np.ndarray:
        return trip(*args)

    return call


async def run_items(pool: ProcessPool, items: list[Any]) -> list[Any]:
    """One batch of ``items`` through ``pool.run``, every item wanted; its outcomes."""
    job = BatchJob(items, [None] * len(items), lambda _: True, len(items))
    return (await pool.run(job)).outcomes


def first(pool: ProcessPool, array: np.ndarray) -> Callable[[], Awaitable[np.ndarray]]:
    """``pool.run([array])``, answering the one result."""

    async def call() -> np.ndarray:
        (result,) = await run_items(pool, [array])
        if not isinstance(result, np.ndarray):
            raise AssertionError(f"the pool answered {result!r}")
        return result

    return call


@asynccontextmanager
async def running_pool(arena: bool, pool: ProcessPool | None = None) -> AsyncIterator[ProcessPool]:
    """A started, warmed-up one-worker pool of :class:`Identity`; ``arena=False``
    gives its worker no arena, so that everything goes through the pipe."""
    pool = pool or ProcessPool(Stage(Identity, batching=BatchConfig(max_batch_size=BATCH)))
    no_arena = mock.patch.object(processes_module.Arena, "create", return_value=None)
    with nullcontext() if arena else no_arena:
        await pool.start()
    await pool.warm_up([])
    try:
        yield pool
    finally:
        await pool.close()


class TimedPool(ProcessPool):
    """A pool that records how long the event loop spends taking each message."""

    def __init__(self, stage: Stage) -> None:
        super().__init__(stage)
        self.receive_s: list[float] = []

    def _take_message(self, worker: Any) -> bool:
        start = time.perf_counter()
        try:
            return super()._take_message(worker)
        finally:
            self.receive_s.append(time.perf_counter() - start)


async def table_receive(sizes: list[int], budget_s: float, blocks: int) -> dict[str, Any]:
    """Table 2b: a result copied out on the event loop vs on a thread."""
    rows: dict[str, dict[str, float]] = {}
    default = pool_module._COPY_ON_THREAD_BYTES
    stage = Stage(Identity, batching=BatchConfig(max_batch_size=BATCH))
    async with running_pool(True, TimedPool(stage)) as pool:
        assert isinstance(pool, TimedPool)
        for size in sizes:
            array = np.arange(size // 4, dtype=np.float32)
            trip = first(pool, array)
            await trip()
            start = time.perf_counter()
            await trip()
            calls = max(1, int(budget_s / blocks / 2 / (time.perf_counter() - start)))
            samples: dict[str, list[float]] = {"loop": [], "thread": []}
            receive: dict[str, list[float]] = {"loop": [], "thread": []}
            for _ in range(blocks):
                for where in samples:
                    pool_module._COPY_ON_THREAD_BYTES = 0 if where == "thread" else 1 << 62
                    gc.collect()
                    pool.receive_s.clear()
                    begin = time.perf_counter()
                    for _ in range(calls):
                        await trip()
                    samples[where].append((time.perf_counter() - begin) / calls)
                    receive[where].extend(pool.receive_s)
            pool_module._COPY_ON_THREAD_BYTES = default
            row: dict[str, float] = {}
            for where in samples:
                row[f"round trip, copy on {where}"] = statistics.median(samples[where]) * 1e3
                row[f"loop in receive, copy on {where}"] = statistics.median(receive[where]) * 1e3
                row[f"loop in receive max, copy on {where}"] = max(receive[where]) * 1e3
            rows[_size_name(size)] = row
    return rows


def _size_name(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else f"{size // 1024} KiB"


# -- table 3: the simulated accelerator -----------------------------------------------


async def closed_loop(
    call: Callable[[int], Awaitable[Any]], callers: int, warmup_s: float, seconds: float
) -> dict[str, float]:
    """``callers`` loops calling back to back; counts calls started after the warm-up
    that finished before the end."""
    loop = asyncio.get_running_loop()
    begin = loop.time()
    measure_from, stop_at = begin + warmup_s, begin + warmup_s + seconds
    latencies: list[float] = []

    async def caller(index: int) -> None:
        item = index * 1_000_000
        clock = loop.time
        while (start := clock()) < stop_at:
            item += 1
            result = await call(item)
            end = clock()
            if result != item:
                raise AssertionError(f"wrong answer for {item}: {result!r}")
            if start >= measure_from and end <= stop_at:
                latencies.append(end - start)

    gc.collect()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    ordered = sorted(latencies)
    return {
        "items_per_s": len(ordered) / seconds,
        "p50_ms": percentile(ordered, 0.5) * 1e3,
        "p99_ms": percentile(ordered, 0.99) * 1e3,
    }


async def counted(
    call: Callable[[int], Awaitable[Any]],
    counters: Callable[[], tuple[int, int]],
    callers: int,
    warmup_s: float,
    seconds: float,
) -> dict[str, float]:
    """:func:`closed_loop`, plus the mean batch size over the whole run."""
    batches, items = counters()
    row = await closed_loop(call, callers, warmup_s, seconds)
    batches_after, items_after = counters()
    row["mean_batch"] = (items_after - items) / max(1, batches_after - batches)
    return row


class BareProcessBatcher:
    """The least code that batches into a worker process: the floor for (b).

    No policy (whatever is queued when the worker can take a batch goes), no
    deadlines, no error handling. The next batch is sent as soon as a result arrives,
    before its callers are answered; ``depth=2`` keeps one batch queued in the pipe
    so the worker never waits for the serving process.
    """

    def __init__(self, conn: Connection, depth: int) -> None:
        self.conn, self.depth = conn, depth
        self.items: list[Any] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.sent: list[list[asyncio.Future[Any]]] = []
        self.batches = self.total = 0
        asyncio.get_running_loop().add_reader(conn.fileno(), self._on_result)

    def close(self) -> None:
        """Stop watching the pipe."""
        asyncio.get_running_loop().remove_reader(self.conn.fileno())

    async def call(self, item: Any) -> Any:
        """Queue one item; send a batch if the worker can take one."""
        future = asyncio.get_running_loop().create_future()
        self.items.append(item)
        self.futures.append(future)
        if len(self.sent) < self.depth:
            self._send_next()
        return await future

    def _send_next(self) -> None:
        items, futures = self.items[:BATCH], self.futures[:BATCH]
        del self.items[:BATCH], self.futures[:BATCH]
        self.sent.append(futures)
        self.batches, self.total = self.batches + 1, self.total + len(items)
        send(self.conn, items)

    def _on_result(self) -> None:
        results = receive(self.conn)
        futures = self.sent.pop(0)
        while self.items and len(self.sent) < self.depth:
            self._send_next()
        for future, result in zip(futures, results, strict=True):
            future.set_result(result)


async def run_floor(depth: int, callers: int, warmup_s: float, seconds: float) -> dict[str, float]:
    """The floor: :class:`BareProcessBatcher` with one worker process."""
    with child(accelerator_worker) as conn:
        floor = BareProcessBatcher(conn, depth)
        try:
            return await counted(
                floor.call, lambda: (floor.batches, floor.total), callers, warmup_s, seconds
            )
        finally:
            floor.close()


def _config() -> BatchConfig:
    return BatchConfig(max_batch_size=BATCH, max_latency_ms=LATENCY_MS)


async def run_inprocess(callers: int, warmup_s: float, seconds: float) -> dict[str, float]:
    """(a) the in-process Batcher (the model runs in its thread)."""
    batcher: Batcher[int, int] = Batcher(accelerate, _config())
    try:

        def counters() -> tuple[int, int]:
            stats = batcher.stats()
            return stats.batches, stats.items

        return await counted(batcher.submit, counters, callers, warmup_s, seconds)
    finally:
        await batcher.close()


async def run_service(callers: int, warmup_s: float, seconds: float) -> dict[str, float]:
    """(b) a Service with one process stage."""
    async with Service(Stage(Accelerator, workers=1, batching=_config())) as service:

        def counters() -> tuple[int, int]:
            stats = service.stats().stages[0].batching
            return stats.batches, stats.items

        return await counted(service.submit, counters, callers, warmup_s, seconds)


async def run_mpservice(callers: int, warmup_s: float, seconds: float) -> dict[str, float]:
    """(c) mpservice: one ProcessServlet worker with the same batch settings."""
    shared = MP_SPAWN_CTX.Array("q", 2)
    servlet = mpserver.ProcessServlet(
        MpsAccelerator, cpus=1, batch_size=BATCH, batch_wait_time=LATENCY_MS / 1e3, counters=shared
    )
    async with mpserver.AsyncServer(servlet, capacity=4 * max(callers, 256)) as server:

        def counters() -> tuple[int, int]:
            with shared.get_lock():
                return shared[0], shared[1]

        return await counted(server.call, counters, callers, warmup_s, seconds)


def table_accelerator(
    levels: list[int], warmup_s: float, seconds: float
) -> list[dict[str, float | str]]:
    """Table 3: every contender at every level, contenders side by side per level."""
    contenders: dict[str, Callable[[int, float, float], Awaitable[dict[str, float]]]] = {
        "(a) in-process Batcher": run_inprocess,
        "(b) Service, process stage": run_service,
        "floor: bare process, depth 1": functools.partial(run_floor, 1),
        "floor: bare process, depth 2": functools.partial(run_floor, 2),
    }
    if mpserver is not None:
        contenders["(c) mpservice ProcessServlet"] = run_mpservice
    rows: list[dict[str, float | str]] = []
    for callers in levels:
        for name, run in contenders.items():
            row: dict[str, float | str] = dict(asyncio.run(run(callers, warmup_s, seconds)))
            row.update(contender=name, callers=callers)
            rows.append(row)
            print(
                f"  {name:32} {callers:4d} callers: {row['items_per_s']:8.0f} items/s", flush=True
            )
    return rows


def accelerator_ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Throughput ratios per level: (b)/(a), (b)/(c), and (b) over each floor."""
    by = {(row["contender"], row["callers"]): row["items_per_s"] for row in rows}
    pairs = {
        "b/a": ("(b) Service, process stage", "(a) in-process Batcher"),
        "b/c": ("(b) Service, process stage", "(c) mpservice ProcessServlet"),
        "b/floor1": ("(b) Service, process stage", "floor: bare process, depth 1"),
        "b/floor2": ("(b) Service, process stage", "floor: bare process, depth 2"),
    }
    ratios: dict[str, dict[str, float]] = {}
    for callers in sorted({row["callers"] for row in rows}):
        ratios[str(callers)] = {
            name: by[top, callers] / by[bottom, callers]
            for name, (top, bottom) in pairs.items()
            if (top, callers) in by and (bottom, callers) in by
        }
    return ratios


# -- output ---------------------------------------------------------------------------


def print_tables(results: dict[str, Any]) -> None:
    """The tables that ran, as text."""
    if "overhead_us" in results:
        print_overhead(results["overhead_us"])
    if "shm_ms" in results:
        print_shm(results["shm_ms"])
    if "receive_ms" in results:
        print_receive(results["receive_ms"])
    if "accelerator" in results:
        print_accelerator(results["accelerator"], results["accelerator_ratios"])


def print_overhead(table: dict[str, dict[str, float]]) -> None:
    """Table 1 as text."""
    print("\nTable 1: per-batch round trip, us per batch (median of blocks)")
    for payload, row in table.items():
        direct = row["direct call"]
        print(f"  {payload}")
        for path, value in row.items():
            if path == "service_mean_batch":
                print(f"    {'(service mean batch size)':36} {value:10.1f}")
            else:
                print(f"    {path:36} {value:10.1f} us   (+{value - direct:.1f} over direct)")


def print_receive(table: dict[str, dict[str, float]]) -> None:
    """Table 2b as text."""
    print("\nTable 2b: ProcessPool.run with the arena, ms: result copied out on the loop / thread")
    print(f"  {'size':8}{'round trip':>22}{'loop in receive':>22}{'loop in receive, max':>24}")
    for size, row in table.items():
        cells = [
            f"{row[f'{what}, copy on loop']:9.3f} /{row[f'{what}, copy on thread']:9.3f}"
            for what in ("round trip", "loop in receive", "loop in receive max")
        ]
        print(f"  {size:8}{cells[0]:>22}{cells[1]:>22}{cells[2]:>24}")


def print_shm(table: dict[str, dict[str, float]]) -> None:
    """Table 2 as text: a line per path, a column per size, then the speed-ups."""
    print("\nTable 2: one float32 array to a process and back, ms per round trip")
    sizes = list(table)
    print(f"  {'path':34}" + "".join(f"{size:>10}" for size in sizes))
    for path in table[sizes[0]]:
        print(f"  {path:34}" + "".join(f"{table[size][path]:10.3f}" for size in sizes))
    ratios = {
        "pipe frames / arena": ("pipe frames (transport.py)", "arena (transport.py)"),
        "before the arena / arena": ("pipe frames, before the arena", "arena (transport.py)"),
        "ProcessPool.run: pipe / arena": (
            "ProcessPool.run, pipe frames",
            "ProcessPool.run, arena",
        ),
    }
    for name, (top, bottom) in ratios.items():
        cells = "".join(f"{table[size][top] / table[size][bottom]:9.2f}x" for size in sizes)
        print(f"  {name:34}" + cells)


def print_accelerator(rows: list[dict[str, Any]], ratios: dict[str, dict[str, float]]) -> None:
    """Table 3 and its ratios as text."""
    print(
        f"\nTable 3: simulated accelerator, batch {BATCH}, wait {LATENCY_MS:g} ms, "
        "limit 19.5k items/s"
    )
    print(
        f"  {'contender':32} {'callers':>7} {'items/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'mean batch':>10}"
    )
    for row in rows:
        print(
            f"  {row['contender']:32} {row['callers']:7d} {row['items_per_s']:9.0f} "
            f"{row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {row['mean_batch']:10.1f}"
        )
    for callers, ratio in ratios.items():
        text = "  ".join(f"{key} = {value:.2f}" for key, value in ratio.items())
        print(f"  {callers:>4} callers: {text}")


def main() -> None:
    """Parse flags, run the three tables, print them and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (smoke test)")
    parser.add_argument("--seconds", type=float, default=5.0, help="table 3 window per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="table 3 warm-up per run")
    parser.add_argument("--levels", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["overhead", "shm", "accel"],
        help="tables not to run (the JSON keeps their last results)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup = 1.0, 0.3
    calls, blocks = (50, 3) if args.quick else (400, 7)
    sizes = [64 * 1024, MIB, 4 * MIB, 16 * MIB, 64 * MIB]

    print(
        f"microbatch {microbatch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, mpservice {'yes' if mpserver is not None else 'not installed'}"
    )
    results: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    if "overhead" not in args.skip:
        results["overhead_us"] = table_overhead(calls, blocks)
    if "shm" not in args.skip:
        budget_s, shm_blocks = (1.0, 3) if args.quick else (8.0, 5)
        results["shm_ms"] = asyncio.run(table_shm(sizes, budget_s, shm_blocks))
        results["receive_ms"] = asyncio.run(table_receive(sizes, budget_s / 2, shm_blocks))
    if "accel" not in args.skip:
        rows = table_accelerator(args.levels, args.warmup, args.seconds)
        results["accelerator"] = rows
        results["accelerator_ratios"] = accelerator_ratios(rows)
        results["accelerator_settings"] = {
            "seconds": args.seconds,
            "warmup_s": args.warmup,
            "max_batch_size": BATCH,
            "max_latency_ms": LATENCY_MS,
            "microbatch_policy": "adaptive (default)",
            "mpservice": f"batch_size={BATCH}, batch_wait_time={LATENCY_MS / 1e3}",
        }
    print_tables(results)
    if args.skip and args.out.exists():
        results = {**json.loads(args.out.read_text()), **results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
