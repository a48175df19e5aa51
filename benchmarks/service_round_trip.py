"""A Service's own round trip, without HTTP (issue 15): one process worker, one item
per call from ``callers`` coroutines in a closed loop (``submit_nowait``).

With one caller it splits each item's time, by the worker's own stamps, into the way
to the model's start, the model, and the way back to the caller; with more it gives
items/s, the serving process's CPU per item and the mean batch. ``--model sim`` sleeps
2 ms per batch (processes go idle), ``scalar`` answers at once (they stay busy).

    PYTHONPATH=src python benchmarks/service_round_trip.py --callers 1 --model sim
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop

import microbatch
from microbatch.timing import Timing


class Scalar(microbatch.Model):
    """Answers at once."""

    def predict(self, batch: list[int]) -> list[int]:
        return [x + 1 for x in batch]


class Sim(microbatch.Model):
    """A simulated accelerator: 2 ms per batch."""

    def predict(self, batch: list[int]) -> list[int]:
        time.sleep(0.002)
        return [x + 1 for x in batch]


async def one_caller(service: microbatch.Service[Any, Any], seconds: float) -> str:
    """Each item's way there, model time and way back (medians, ms)."""
    there, model, back = [], [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        timing = Timing(time.monotonic())
        started = time.perf_counter()
        await service.submit_nowait(1, timing=timing)
        total = time.perf_counter() - started
        stage = timing.stages[-1]
        there.append(stage.queued_s + stage.behind_s)
        model.append(stage.model_s)
        back.append(total - there[-1] - stage.model_s)
    ms = [statistics.median(values) * 1e3 for values in (there, model, back)]
    return (
        f"1 caller, {len(there)} items: to the model {ms[0]:.3f} ms, model {ms[1]:.3f} ms, "
        f"back to the caller {ms[2]:.3f} ms (medians)"
    )


async def many_callers(service: microbatch.Service[Any, Any], callers: int, seconds: float) -> str:
    """Items/s, serving-process CPU per item and mean batch of a closed loop."""
    done, stop = 0, False

    async def caller() -> None:
        nonlocal done
        while not stop:
            await service.submit_nowait(1)
            done += 1

    before = service.stats().stages[0].batching
    cpu, wall = time.process_time(), time.monotonic()
    tasks = [asyncio.create_task(caller()) for _ in range(callers)]
    await asyncio.sleep(seconds)
    stop = True
    count, cpu, wall = done, time.process_time() - cpu, time.monotonic() - wall
    after = service.stats().stages[0].batching
    await asyncio.gather(*tasks)
    batch = (after.items - before.items) / max(after.batches - before.batches, 1)
    return (
        f"{callers} callers: {count / wall:,.0f} items/s, {cpu / count * 1e6:.1f} µs CPU "
        f"per item, mean batch {batch:.1f}"
    )


async def main(model: str, callers: int, seconds: float) -> None:
    config = microbatch.BatchConfig(max_batch_size=64, max_latency_ms=5)
    stage = microbatch.Stage(Sim if model == "sim" else Scalar, workers=1, batching=config)
    async with microbatch.Service(stage) as service:
        for item in range(200):  # warm up
            await service.submit(item)
        if callers == 1:
            print(model, await one_caller(service, seconds))
        else:
            print(model, await many_callers(service, callers, seconds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["sim", "scalar"], default="sim")
    parser.add_argument("--callers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    uvloop.run(main(args.model, args.callers, args.seconds))
