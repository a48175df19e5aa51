"""Does the embedding example gain from tokenizing in a stage of its own?

1. The model alone, offline, in this process: texts/s at batch 1, 8, 32 and 64.
2. The service both ways — ``tokenize`` + ``encode`` stages, and one ``embed`` stage —
   driven by N concurrent asyncio callers for a few seconds each, alternated so that
   both see the same machine: texts/s and p50/p99 latency.

Run: ``python benchmarks/embedding_stages.py [--threads 2] [--seconds 10]``. Needs the
``examples`` extra. Writes ``benchmarks/results/embedding_stages.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.embeddings import (
    EXAMPLES,
    EmbedRequest,
    Encode,
    Tokenize,
    make_service,
)
from microbatch.pipeline import WorkerContext

RESULTS = Path(__file__).parent / "results" / "embedding_stages.json"


def offline(threads: int, sizes: list[int], repeats: int) -> dict[int, float]:
    """Texts/s of tokenize + encode in this process, median of ``repeats`` batches."""
    tokenize, encode = Tokenize(), Encode(threads=threads, device="cpu")
    tokenize.setup(WorkerContext("tokenize", 0))
    encode.setup(WorkerContext("encode", 0))
    rates = {}
    for size in sizes:
        batch = (EXAMPLES * size)[:size]
        encode.predict(tokenize.predict(batch))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            encode.predict(tokenize.predict(batch))
            times.append(time.perf_counter() - start)
        rates[size] = size / statistics.median(times)
    return rates


async def load(split: bool, threads: int, callers: int, seconds: float) -> dict[str, Any]:
    """Closed loop: ``callers`` tasks each submit one text after another."""
    latencies: list[float] = []
    async with make_service(threads=threads, split=split) as service:
        stop = time.perf_counter() + seconds

        async def caller(index: int) -> None:
            j = 0
            while time.perf_counter() < stop:
                request = EmbedRequest(f"{EXAMPLES[(index + j) % len(EXAMPLES)].text} {j}")
                start = time.perf_counter()
                await service.submit(request)
                latencies.append(time.perf_counter() - start)
                j += 1

        began = time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(callers)))
        elapsed = time.perf_counter() - began
        stats = service.stats()
    latencies.sort()
    return {
        "stages": [s.name for s in stats.stages],
        "texts_per_s": len(latencies) / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "mean_batch": [round(s.batching.mean_batch_size, 1) for s in stats.stages],
    }


def main() -> None:
    """Run both measurements and print and save them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each load run")
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two layouts")
    args = parser.parse_args()

    rates = offline(args.threads, [1, 8, 32, 64], repeats=7)
    for size, rate in rates.items():
        print(f"model alone, batch {size:>2}: {rate:6.1f} texts/s")
    runs: dict[str, list[dict[str, Any]]] = {"split": [], "single": []}
    for _ in range(args.rounds):
        for name in runs:
            run = asyncio.run(load(name == "split", args.threads, args.callers, args.seconds))
            runs[name].append(run)
            print(
                f"{name:>6} ({' + '.join(run['stages'])}), {args.callers} callers: "
                f"{run['texts_per_s']:6.1f} texts/s, p50 {run['p50_ms']:.0f} ms, "
                f"p99 {run['p99_ms']:.0f} ms, mean batch {run['mean_batch']}"
            )
    best = {name: max(r["texts_per_s"] for r in rs) for name, rs in runs.items()}
    print(f"split / single (best of {args.rounds}): {best['split'] / best['single']:.2f}")
    RESULTS.write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{platform.machine()}, {platform.processor() or ''} "
                f"{__import__('os').cpu_count()} cpus",
                "threads": args.threads,
                "callers": args.callers,
                "offline_texts_per_s": rates,
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
