"""Streams: step-wise batching against lockstep, side by side in one run.

A simulated step model: each step takes ``1 ms + 10 µs × items in the step`` (a
sleep in the worker thread, as an accelerator would); output lengths are
long-tailed between 8 and 256 steps (log-uniform: many short, a few long). At 16
and 64 concurrent streams (closed loop: each client opens its next stream when its
last one ended), the same list of lengths goes to

* **microbatch step-wise**: a ``StepModel``; items join and leave between steps;
* **microbatch lockstep**: a generator ``predict``; a batch runs until its longest
  item ends (padded: every step costs the whole batch), new items wait for it —
  how peers batch streams (LitServe ``stream=True`` with batching, Ray Serve
  ``@serve.batch`` over generators, MOSEC SSE).

Reported per contender: chunks/s, time to first chunk p50/p99 (also in step times
of the step-wise run), total time p50/p99 for short (≤ 16 chunks) and long (≥ 128)
streams. Targets (issue 17, at 64 streams): step-wise ≥ 2× the chunks/s of every
lockstep contender; TTFC p99 ≤ 5 step times; short streams' total p99 ≤ a third of
lockstep's.

Run: ``python benchmarks/streaming.py`` (about 20 s); writes
``benchmarks/results/streaming.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import microbatch
from microbatch import END, Service, Stage, StepModel

RESULTS = Path(__file__).resolve().parent / "results"
BASE_STEP_S = 0.001
PER_ITEM_STEP_S = 0.00001
MAX_ACTIVE = 64


def step_time_s(active: int) -> float:
    """What one step over ``active`` items costs."""
    return BASE_STEP_S + PER_ITEM_STEP_S * active


class SimulatedSteps(StepModel):
    """Item ``n``: ``n`` chunks; each step sleeps like an accelerator would."""

    def start(self, items: list[int]) -> list[list[int]]:
        return [[n, 0] for n in items]

    def step(self, states: list[list[int]]) -> tuple[list[int], list[bool]]:
        time.sleep(step_time_s(len(states)))
        for state in states:
            state[1] += 1
        return [state[1] for state in states], [position >= n for n, position in states]


class SimulatedLockstep(microbatch.Model):
    """The same model as a generator ``predict``: the whole batch steps until its
    longest item ends (finished items are padding: they still cost)."""

    def predict(self, batch: list[int]) -> Iterator[list[Any]]:
        for position in range(1, max(batch) + 1):
            time.sleep(step_time_s(len(batch)))
            yield [position if position <= n else END for n in batch]


def lengths(count: int, seed: int) -> list[int]:
    """Long-tailed output lengths in [8, 256] (log-uniform)."""
    rng = random.Random(seed)
    return [min(256, int(8 * 32 ** rng.random())) for _ in range(count)]


async def run_one(
    model: type[microbatch.Model], concurrency: int, work: list[int]
) -> dict[str, Any]:
    """Stream every length in ``work`` with ``concurrency`` clients; the figures."""
    service = Service(Stage(model, mode="thread", max_batch_size=MAX_ACTIVE, max_queue=10_000))
    records: list[tuple[int, float, float]] = []  # length, first chunk s, total s
    queue = list(reversed(work))

    async def client() -> None:
        while queue:
            length = queue.pop()
            opened = time.perf_counter()
            first = None
            count = 0
            async for _ in service.stream(length):
                if first is None:
                    first = time.perf_counter() - opened
                count += 1
            assert count == length and first is not None
            records.append((length, first, time.perf_counter() - opened))

    async with service:
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        streams = service.stats().stages[0].streams
    assert streams is not None
    firsts = sorted(r[1] for r in records)
    short = sorted(r[2] for r in records if r[0] <= 16)
    long = sorted(r[2] for r in records if r[0] >= 128)
    return {
        "streams": len(records),
        "chunks": sum(r[0] for r in records),
        "seconds": wall,
        "chunks_per_s": sum(r[0] for r in records) / wall,
        "steps": streams.steps,
        "mean_step_ms": 1000 * streams.step_seconds / max(1, streams.steps),
        "ttfc_p50_ms": 1000 * percentile(firsts, 0.50),
        "ttfc_p99_ms": 1000 * percentile(firsts, 0.99),
        "short_total_p50_ms": 1000 * percentile(short, 0.50),
        "short_total_p99_ms": 1000 * percentile(short, 0.99),
        "long_total_p50_ms": 1000 * percentile(long, 0.50),
        "long_total_p99_ms": 1000 * percentile(long, 0.99),
    }


def percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


CONTENDERS = {"microbatch step-wise": SimulatedSteps, "microbatch lockstep": SimulatedLockstep}


async def main(rounds: int, levels: list[int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for concurrency in levels:
        work = lengths(rounds * concurrency, seed=concurrency)
        for name, model in CONTENDERS.items():
            figures = await run_one(model, concurrency, work)
            results[f"{name} @ {concurrency}"] = figures
            print(
                f"{name:22} @ {concurrency:3}: "
                + json.dumps({k: round(v, 2) for k, v in figures.items()})
            )
    return results


def report(results: dict[str, Any], levels: list[int]) -> str:
    lines = [
        "# Streams: step-wise against lockstep (`benchmarks/streaming.py`)",
        "",
        f"Machine: {platform.machine()}, {platform.python_version()}; shared with other"
        " jobs while it ran, so absolute numbers are noisy: read the ratios, all from one run.",
        "",
        "Simulated step model: each step sleeps 1 ms + 10 µs × items in the step (in the"
        " worker thread); output lengths log-uniform in [8, 256]; closed loop;"
        f" max_active {MAX_ACTIVE}. In-process (`service.stream`), so HTTP costs are out"
        " of the comparison: this measures the batching strategy.",
        "",
        "| contender | streams | chunks/s | TTFC p50 ms | TTFC p99 ms | short (≤16) total p50/p99 ms"
        " | long (≥128) total p50/p99 ms | mean step ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, f in results.items():
        lines.append(
            f"| {key} | {f['streams']} | {f['chunks_per_s']:.0f} | {f['ttfc_p50_ms']:.1f}"
            f" | {f['ttfc_p99_ms']:.1f} | {f['short_total_p50_ms']:.0f} / {f['short_total_p99_ms']:.0f}"
            f" | {f['long_total_p50_ms']:.0f} / {f['long_total_p99_ms']:.0f} | {f['mean_step_ms']:.2f} |"
        )
    lines += ["", "## Targets (at 64 streams)", ""]
    for concurrency in levels:
        step = results.get(f"microbatch step-wise @ {concurrency}")
        lock = results.get(f"microbatch lockstep @ {concurrency}")
        if step is None or lock is None:
            continue
        ratio = step["chunks_per_s"] / lock["chunks_per_s"]
        ttfc_steps = step["ttfc_p99_ms"] / step["mean_step_ms"]
        short = step["short_total_p99_ms"] / lock["short_total_p99_ms"]
        lines += [
            f"At {concurrency} streams:",
            "",
            f"- step-wise chunks/s ÷ lockstep: **{ratio:.2f}×** (target ≥ 2×:"
            f" {'met' if ratio >= 2 else 'missed'})",
            f"- step-wise TTFC p99 = **{ttfc_steps:.1f} step times** (target ≤ 5:"
            f" {'met' if ttfc_steps <= 5 else 'missed'})",
            f"- short streams' total p99, step-wise ÷ lockstep: **{short:.2f}** (target ≤ 0.33:"
            f" {'met' if short <= 1 / 3 else 'missed'})",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="streams per client")
    parser.add_argument("--levels", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    results = asyncio.run(main(args.rounds, args.levels))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "streaming.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "streaming.md").write_text(report(results, args.levels) + "\n")
    print(report(results, args.levels))
