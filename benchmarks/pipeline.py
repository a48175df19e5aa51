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
out on the event loop vs on a thread (``dispatch._COPY_ON_THREAD_BYTES``): the round
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

Table 1 and the command are here; the transports and tables 2 and 2b are in
``pipeline_transport.py``, table 3 in ``pipeline_accelerator.py``, the timed blocks in
``loadgen.py``.

Writes ``benchmarks/results/pipeline.json`` (with ``--skip``, the skipped tables keep
their results from the last run). Timings on a shared machine are noisy: the ratios
within one run are what count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

import microbatch
from loadgen import atime_blocks, time_blocks
from microbatch import BatchConfig, Service, Stage
from microbatch.pipeline import ProcessPool
from microbatch.pipeline.transport import receive, send
from pipeline_accelerator import (
    LATENCY_MS,
    accelerator_ratios,
    mpserver,
    print_accelerator,
    table_accelerator,
)
from pipeline_transport import (
    BATCH,
    MIB,
    Identity,
    before_echo,
    child,
    pipe_echo,
    print_receive,
    print_shm,
    receive_before,
    run_items,
    send_before,
    table_receive,
    table_shm,
)

RESULTS = Path(__file__).resolve().parent / "results" / "pipeline.json"


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
