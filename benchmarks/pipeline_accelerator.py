"""Table 3 of ``benchmarks/pipeline.py``: the simulated accelerator
(``time.sleep(0.002 + 0.00002 * n)``, max batch 64, max wait 10 ms) behind (a) the
in-process ``Batcher``, (b) a ``Service`` with one process stage, (c) mpservice when
installed, and the floor: the least code that batches into a worker process.

Imported by spawned children: nothing here runs at import but the mpservice probe.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

from loadgen import percentile
from microbatch import BatchConfig, Batcher, Model, Service, Stage
from microbatch.pipeline.transport import receive, send
from pipeline_transport import BATCH, child

try:
    from mpservice import mpserver
    from mpservice.multiprocessing import MP_SPAWN_CTX
except ImportError as error:  # the table then has no mpservice rows
    print(f"(mpservice not importable: {error})", file=sys.stderr)
    mpserver = None

LATENCY_MS = 10.0


def accelerator_delay_s(n: int) -> float:
    """The simulated accelerator's time for a batch of ``n``: 2 ms + 20 us per item."""
    return 0.002 + 0.00002 * n


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


def accelerator_worker(conn: Connection) -> None:
    """Child: run the accelerator on every batch until ``None`` (the floor's worker)."""
    while (batch := receive(conn)) is not None:
        send(conn, accelerate(batch))


# -- the contenders -------------------------------------------------------------------


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
