"""The transports of ``benchmarks/pipeline.py``'s tables 1 and 2: spawned children
that echo what they receive (through ``pipeline/transport.py``, the transport before
the arena, the arena, or ``multiprocessing.shared_memory`` by hand), one round trip
through each, a one-worker ``ProcessPool`` of :class:`Identity`; and tables 2 and 2b
(pipe vs shared memory, a result copied out on the loop vs on a thread).

Imported by spawned children: nothing here runs at import.
"""

from __future__ import annotations

import gc
import pickle
import statistics
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, nullcontext, suppress
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any
from unittest import mock

import numpy as np

from loadgen import atime_blocks
from microbatch import BatchConfig, Model, Stage
from microbatch.pipeline import ProcessPool
from microbatch.pipeline import dispatch as dispatch_module
from microbatch.pipeline import processes as processes_module
from microbatch.pipeline.arena import Arena
from microbatch.pipeline.transport import read_message, receive, send
from microbatch.types import BatchJob

BATCH = 64
SPAWN = get_context("spawn")
MIB = 1 << 20


class Identity(Model):
    """Returns its batch: the trivial model."""

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


# -- child processes -------------------------------------------------------------------


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


# -- one round trip ----------------------------------------------------------------


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


# -- table 2: pipe vs shared memory; 2b: copy on the loop or a thread ----------------


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


class TimedPool(ProcessPool):
    """A pool that records how long the event loop spends taking each message."""

    def __init__(self, stage: Stage) -> None:
        super().__init__(stage)
        self.receive_s: list[float] = []

    def _handle(self, worker: Any, message: Any) -> None:
        start = time.perf_counter()
        try:
            super()._handle(worker, message)
        finally:
            self.receive_s.append(time.perf_counter() - start)


async def table_receive(sizes: list[int], budget_s: float, blocks: int) -> dict[str, Any]:
    """Table 2b: a result copied out on the event loop vs on a thread."""
    rows: dict[str, dict[str, float]] = {}
    default = dispatch_module._COPY_ON_THREAD_BYTES
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
                    dispatch_module._COPY_ON_THREAD_BYTES = 0 if where == "thread" else 1 << 62
                    gc.collect()
                    pool.receive_s.clear()
                    begin = time.perf_counter()
                    for _ in range(calls):
                        await trip()
                    samples[where].append((time.perf_counter() - begin) / calls)
                    receive[where].extend(pool.receive_s)
            dispatch_module._COPY_ON_THREAD_BYTES = default
            row: dict[str, float] = {}
            for where in samples:
                row[f"round trip, copy on {where}"] = statistics.median(samples[where]) * 1e3
                row[f"loop in receive, copy on {where}"] = statistics.median(receive[where]) * 1e3
                row[f"loop in receive max, copy on {where}"] = max(receive[where]) * 1e3
            rows[_size_name(size)] = row
    return rows


def _size_name(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else f"{size // 1024} KiB"


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
