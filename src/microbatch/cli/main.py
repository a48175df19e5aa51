"""The ``microbatch`` command line. Only this module reads argv."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Sequence

from .. import __version__
from ..bench import command as bench
from ..decorator import batch
from ..serve.server import add_serve_arguments, run_serve
from ..stats import BatcherStats
from ..tune import command as tune

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``microbatch`` command; return the exit status."""
    parser = argparse.ArgumentParser(prog="microbatch", description="Dynamic batching for models.")
    parser.add_argument("--version", action="version", version=f"microbatch {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="many concurrent callers of a batched model, in-process"
    )
    demo.add_argument("--callers", type=int, default=256, help="asyncio callers (default 256)")
    demo.add_argument("--threads", type=int, default=32, help="thread callers (default 32)")
    demo.add_argument("--seconds", type=float, default=3.0, help="length of each run")
    demo.add_argument("--max-batch-size", type=int, default=64)
    demo.add_argument("--max-latency-ms", type=float, default=10.0)
    serve = commands.add_parser("serve", help="serve a Service or @batch function over HTTP")
    add_serve_arguments(serve)
    add_ray_arguments(serve)
    tune.add_parser(commands)
    bench.add_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return run_serve_on_ray(args) if args.ray else run_serve(args)
    if args.command == "tune":
        return tune.run(args)
    if args.command == "bench":
        return bench.run(args)
    if args.command == "demo":
        run_demo(args.callers, args.threads, args.seconds, args.max_batch_size, args.max_latency_ms)
    return 0


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``serve``'s Ray options (Ray itself is imported only with ``--ray``)."""
    group = parser.add_argument_group(
        "Ray", "deploy on a Ray cluster behind Ray Serve's proxy (needs microbatch[ray])"
    )
    group.add_argument(
        "--ray",
        action="store_true",
        help="serve as a Ray Serve application (--host/--port: its proxy)",
    )
    group.add_argument("--replicas", type=int, default=1, help="replicas of the service (1)")
    group.add_argument(
        "--ray-address",
        default=None,
        help="cluster to join: auto, HOST:PORT or env RAY_ADDRESS (default: start a local Ray)",
    )
    group.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs per replica (1)")
    group.add_argument(
        "--replica-gpus", type=float, default=0.0, help="GPUs per replica, fractional allowed (0)"
    )
    group.add_argument(
        "--replica-stages",
        choices=["thread", "process"],
        default="thread",
        help="a Service's stages in threads of each replica (default) or in worker processes",
    )


def run_serve_on_ray(args: argparse.Namespace) -> int:
    """``microbatch serve --ray``: a clear message, not a traceback, without Ray."""
    try:
        from ..ray.command import run_on_ray
    except ImportError as error:
        print(f"microbatch serve --ray: {error}", file=sys.stderr)
        return 2
    return run_on_ray(args)


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
        stats = accelerator.loop_batcher.stats()
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


if __name__ == "__main__":
    raise SystemExit(main())
