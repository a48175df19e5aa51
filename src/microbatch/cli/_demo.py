"""``microbatch demo``: many concurrent callers of a batched model, in-process."""

from __future__ import annotations

import asyncio
import threading
import time

from ..decorator import batch
from ..stats import BatcherStats
from ._options import Parsed

__all__ = ["run", "run_demo"]


def run(options: Parsed) -> int:
    """Run ``demo`` with parsed arguments; return the exit status."""
    run_demo(
        options.callers,
        options.threads,
        options.seconds,
        options.max_batch_size,
        options.max_latency_ms,
    )
    return 0


def run_demo(
    callers: int, threads: int, seconds: float, max_batch_size: int, max_latency_ms: float
) -> None:
    """Drive a simulated accelerator (2 ms + 20 us per item) from asyncio and threads."""

    @batch(max_batch_size=max_batch_size, max_latency_ms=max_latency_ms)
    def accelerator(xs: list[int]) -> list[int]:
        time.sleep(0.002 + 0.00002 * len(xs))
        return [2 * x for x in xs]

    limit = max_batch_size / (0.002 + 0.00002 * max_batch_size)
    print(
        f"model: sleep(2 ms + 20 us x batch); one at a time it does {1 / 0.00202:.0f} items/s, "
        f"in batches of {max_batch_size} up to {limit:.0f} items/s\n"
    )

    async def run_async() -> tuple[int, float, BatcherStats]:
        stop = time.monotonic() + seconds
        done = 0

        async def caller(index: int) -> None:
            nonlocal done
            j = 0
            while time.monotonic() < stop:
                item = index * 1_000_000 + j
                assert await accelerator.acall(item) == 2 * item
                done += 1
                j += 1

        start = time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(callers)))
        elapsed = time.perf_counter() - start
        stats = accelerator.batcher.stats()
        await accelerator.aclose()
        return done, elapsed, stats

    done, elapsed, stats = asyncio.run(run_async())
    _report(f"{callers} asyncio callers (await model.acall(x))", done, elapsed, stats)

    stop = time.monotonic() + seconds
    counts = [0] * threads

    def thread_caller(index: int) -> None:
        j = 0
        while time.monotonic() < stop:
            item = index * 1_000_000 + j
            assert accelerator(item) == 2 * item
            counts[index] += 1
            j += 1

    workers = [threading.Thread(target=thread_caller, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    _report(
        f"{threads} threads (model(x))",
        sum(counts),
        time.perf_counter() - start,
        accelerator.batcher.stats(),
    )


def _report(title: str, done: int, elapsed: float, stats: BatcherStats) -> None:
    print(f"{title}: {done / elapsed:,.0f} items/s, mean batch {stats.mean_batch_size:.1f}")
    top = sorted(stats.batch_sizes.items(), key=lambda kv: -kv[1])[:5]
    shown = ", ".join(f"{size}: {count}" for size, count in sorted(top))
    print(f"  batch sizes (size: batches, most common): {shown}")
    print(
        f"  queue wait p50 {stats.queue_wait_p50_ms:.2f} ms, p99 {stats.queue_wait_p99_ms:.2f} ms; "
        f"{stats.batches} batches, {stats.items} items\n"
    )
