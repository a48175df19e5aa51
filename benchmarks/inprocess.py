"""In-process batching overhead and policy behaviour, side by side with peers.

Table 1: a trivial model (``[2 * x for x in xs]``), batch 64: items/s and us/item for
microbatch's asyncio and thread batchers, the bare floors (futures resolved in bulk
by a hand-written loop; a hand-written leader/follower thread queue), and the PyPI
libraries ``batched`` and ``async-batcher`` when installed.

Table 2: a simulated accelerator (``time.sleep(0.002 + 0.00002 * n)`` per batch of n,
limit 64 / 3.28 ms = 19.5k items/s) at 1, 16, 64 and 256 concurrent callers:
throughput and p50/p99 latency for the adaptive and the fixed policy.

Run: ``python benchmarks/inprocess.py`` (``--quick`` for a short run). Writes
``benchmarks/results/inprocess.json``. Ratios measured in one run are what count.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import microbatch

BATCH = 64
LATENCY_MS = 10.0
RESULTS = Path(__file__).parent / "results" / "inprocess.json"


def double(xs: list[int]) -> list[int]:
    return [2 * x for x in xs]


async def double_async(xs: list[int]) -> list[int]:
    return [2 * x for x in xs]


def accelerator(xs: list[int]) -> list[int]:
    time.sleep(0.002 + 0.00002 * len(xs))
    return [2 * x for x in xs]


# -- load generators ------------------------------------------------------------


async def async_load(
    call: Callable[[int], Awaitable[int]], callers: int, per_caller: int
) -> dict[str, float]:
    latencies: list[float] = []

    async def caller(index: int) -> None:
        base = index * 1_000_000
        clock = time.perf_counter
        for j in range(per_caller):
            start = clock()
            result = await call(base + j)
            latencies.append(clock() - start)
            if result != 2 * (base + j):
                raise AssertionError(f"wrong answer for {base + j}: {result}")

    gc.collect()  # a collection of earlier runs' garbage must not land in this one
    start = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return _summary(time.perf_counter() - start, latencies)


def thread_load(call: Callable[[int], int], callers: int, per_caller: int) -> dict[str, float]:
    latencies: list[float] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(callers + 1)

    def caller(index: int) -> None:
        base = index * 1_000_000
        clock = time.perf_counter
        mine = []
        barrier.wait()
        try:
            for j in range(per_caller):
                begin = clock()
                result = call(base + j)
                mine.append(clock() - begin)
                if result != 2 * (base + j):
                    raise AssertionError(f"wrong answer for {base + j}: {result}")
        except BaseException as exc:
            errors.append(exc)
        latencies.extend(mine)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    gc.collect()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return _summary(elapsed, latencies)


def _summary(elapsed: float, latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    n = len(ordered)
    return {
        "items": n,
        "seconds": elapsed,
        "items_per_s": n / elapsed,
        "us_per_item": elapsed / n * 1e6,
        "p50_ms": ordered[n // 2] * 1e3,
        "p99_ms": ordered[min(n - 1, int(n * 0.99))] * 1e3,
    }


# -- floors: the least code that batches at all -----------------------------------


class BareFutures:
    """Futures resolved in bulk by a hand-written loop: the asyncio floor."""

    def __init__(self, fn: Callable[[list[int]], list[int]]) -> None:
        self.fn = fn
        self.items: list[int] = []
        self.futures: list[asyncio.Future[int]] = []
        self.wake = asyncio.Event()

    async def call(self, item: int) -> int:
        future = asyncio.get_running_loop().create_future()
        self.items.append(item)
        self.futures.append(future)
        self.wake.set()
        return await future

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.items:
                items, futures = self.items[:BATCH], self.futures[:BATCH]
                del self.items[:BATCH], self.futures[:BATCH]
                for future, result in zip(futures, self.fn(items), strict=True):
                    future.set_result(result)
                await asyncio.sleep(0)


class BareCooperative:
    """A hand-written leader/follower thread queue (no deadlines, no policy): the floor."""

    def __init__(self, fn: Callable[[list[int]], list[int]]) -> None:
        self.fn = fn
        self.lock = threading.Lock()
        self.run_lock = threading.Lock()
        self.items: list[int] = []
        self.done = threading.Event()
        self.results: list[int] = []

    def call(self, item: int) -> int:
        with self.lock:
            index = len(self.items)
            self.items.append(item)
            done, leader = self.done, index == 0
        if leader:
            with self.run_lock:
                with self.lock:
                    items, self.items = self.items, []
                    done, self.done = self.done, threading.Event()
                self.results_of = results = self.fn(items)
                done.results = results  # type: ignore[attr-defined]
                done.set()
        done.wait()
        return done.results[index]  # type: ignore[attr-defined, no-any-return]


# -- table 1 ----------------------------------------------------------------------


async def run_async_rows(callers: int, per_caller: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}

    bare = BareFutures(double)
    runner = asyncio.create_task(bare.run())
    rows["floor: bare futures"] = await async_load(bare.call, callers, per_caller)
    runner.cancel()

    mb = microbatch.batch(max_batch_size=BATCH, max_latency_ms=LATENCY_MS)(double_async)
    rows["microbatch asyncio"] = await async_load(mb, callers, per_caller)
    rows["microbatch asyncio"]["mean_batch"] = mb.batcher.stats().mean_batch_size
    await mb.close()

    try:
        import batched
    except ImportError:
        print("(batched not installed: pip install batched)", file=sys.stderr)
    else:
        peer = batched.aio.dynamically(batch_size=BATCH, timeout_ms=LATENCY_MS)(double_async)
        rows["batched (aio)"] = await async_load(peer, callers, per_caller)

    try:
        from async_batcher.batcher import AsyncBatcher
    except ImportError:
        print("(async-batcher not installed: pip install async-batcher)", file=sys.stderr)
    else:

        class Doubler(AsyncBatcher[int, int]):
            async def process_batch(self, batch: list[int]) -> list[int]:
                return [2 * x for x in batch]

        doubler = Doubler(max_batch_size=BATCH, max_queue_time=LATENCY_MS / 1000)
        rows["async-batcher"] = await async_load(doubler.process, callers, per_caller)
        await doubler.stop()
    return rows


def run_thread_rows(callers: int, per_caller: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    bare = BareCooperative(double)
    rows["floor: bare leader/follower"] = thread_load(bare.call, callers, per_caller)
    mb = microbatch.batch(max_batch_size=BATCH, max_latency_ms=LATENCY_MS)(double)
    rows["microbatch threads"] = thread_load(mb, callers, per_caller)
    rows["microbatch threads"]["mean_batch"] = mb.batcher.stats().mean_batch_size
    try:
        import batched
    except ImportError:
        pass
    else:
        peer = batched.dynamically(batch_size=BATCH, timeout_ms=LATENCY_MS)(double)
        rows["batched (threads)"] = thread_load(peer, callers, per_caller)
    return rows


# -- table 2 ----------------------------------------------------------------------


def model_alone_p50_ms(calls: int = 300) -> float:
    """The model called directly, one item at a time: what batching adds is measured from it."""
    latencies = []
    for i in range(calls):
        start = time.perf_counter()
        accelerator([i])
        latencies.append(time.perf_counter() - start)
    return statistics.median(latencies) * 1e3


async def run_accelerator(concurrency: list[int], seconds: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for policy in ("adaptive", "fixed"):
        for callers in concurrency:
            fn = microbatch.batch(max_batch_size=BATCH, max_latency_ms=LATENCY_MS, policy=policy)(
                accelerator
            )
            per_caller = (
                max(1, int(seconds * 19_500 / callers)) if callers > 1 else int(seconds / 0.0021)
            )
            per_caller = min(per_caller, int(seconds / 0.0021))
            result = await async_load(fn.acall, callers, per_caller)
            result.update(
                mode="asyncio",
                policy=policy,
                callers=callers,
                mean_batch=fn.loop_batcher.stats().mean_batch_size,
            )
            await fn.aclose()
            rows.append(result)
            result = thread_load(fn, callers, per_caller)
            result.update(
                mode="threads",
                policy=policy,
                callers=callers,
                mean_batch=fn.batcher.stats().mean_batch_size,
            )
            rows.append(result)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    scale = 0.1 if args.quick else 1.0

    version = f"microbatch {microbatch.__version__}, Python {platform.python_version()}"
    print(f"{version}, {os.cpu_count()} CPUs")
    async_rows = asyncio.run(run_async_rows(256, int(400 * scale) or 1))
    thread_rows = run_thread_rows(32, int(1000 * scale) or 1)
    floor_async = async_rows["floor: bare futures"]["us_per_item"]
    floor_threads = thread_rows["floor: bare leader/follower"]["us_per_item"]

    print(f"\nTable 1: trivial model, batch {BATCH}; 256 asyncio callers / 32 threads")
    print(f"{'implementation':32} {'items/s':>10} {'us/item':>8} {'x floor':>8} {'mean batch':>10}")
    for rows, floor in ((async_rows, floor_async), (thread_rows, floor_threads)):
        for name, row in rows.items():
            print(
                f"{name:32} {row['items_per_s']:10.0f} {row['us_per_item']:8.2f} "
                f"{row['us_per_item'] / floor:8.2f} {row.get('mean_batch', float('nan')):10.1f}"
            )

    alone_ms = model_alone_p50_ms()
    accel = asyncio.run(run_accelerator([1, 16, 64, 256], 2.0 * scale))
    print(
        "\nTable 2: simulated accelerator, sleep(2 ms + 20 us * n), batch 64, limit 19.5k items/s"
    )
    header = ("mode", "policy", "callers", "items/s", "% limit", "p50 ms", "p99 ms", "mean batch")
    print("{:8} {:9} {:>7} {:>9} {:>8} {:>8} {:>8} {:>10}".format(*header))
    for row in accel:
        print(
            f"{row['mode']:8} {row['policy']:9} {row['callers']:7d} {row['items_per_s']:9.0f} "
            f"{100 * row['items_per_s'] / 19512:7.1f}% {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} "
            f"{row['mean_batch']:10.1f}"
        )
    print(f"\nthe model alone, one item per call: p50 {alone_ms:.2f} ms")
    for row in accel:
        if row["callers"] == 1:
            added = row["p50_ms"] - alone_ms
            print(f"  {row['mode']:8} {row['policy']:9} adds {added:+.2f} ms at concurrency 1")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "trivial_asyncio": async_rows,
                "trivial_threads": thread_rows,
                "accelerator": accel,
                "model_alone_p50_ms": alone_ms,
                "floor_ratio_asyncio": async_rows["microbatch asyncio"]["us_per_item"]
                / floor_async,
            },
            indent=2,
        )
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
