"""Load and timing without wrk, shared by the benchmarks: interleaved timed blocks of
calls (each contender in turn, the median of the blocks), nearest-rank percentiles, and
closed-loop HTTP/1.1 connections on raw asyncio streams (each request tagged, e.g.
with its token count, so latencies can be told apart by kind).
"""

from __future__ import annotations

import asyncio
import gc
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Load", "atime_blocks", "drive", "percentile", "time_blocks"]


# -- timed blocks ----------------------------------------------------------------------


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


# -- closed-loop HTTP/1.1 connections -------------------------------------------------


@dataclass
class Load:
    """Latencies per request, by token count, and errors."""

    latencies: list[tuple[int, float]] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0


async def _connection(
    host: str, port: int, bodies: list[tuple[bytes, int]], path: str, state: dict[str, Any]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    load: Load = state["load"]
    try:
        while not state["stop"]:
            index = state["next"]
            state["next"] = index + 1
            body, tokens = bodies[index % len(bodies)]
            request = (
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            match = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(match.group(1)) if match else 0)
            elapsed = time.perf_counter() - started
            if state["measuring"]:
                if status == 200:
                    load.latencies.append((tokens, elapsed))
                else:
                    load.errors += 1
    finally:
        writer.close()


async def drive(
    base: str,
    path: str,
    bodies: list[tuple[bytes, int]],
    connections: int,
    warmup: float,
    seconds: float,
) -> Load:
    """``connections`` closed-loop connections for ``warmup + seconds``; measure the last."""
    host, port = base.removeprefix("http://").split(":")
    state: dict[str, Any] = {"next": 0, "stop": False, "measuring": False, "load": Load()}
    tasks = [
        asyncio.create_task(_connection(host, int(port), bodies, path, state))
        for _ in range(connections)
    ]
    await asyncio.sleep(warmup)
    state["measuring"] = True
    began = time.perf_counter()
    await asyncio.sleep(seconds)
    state["measuring"] = False
    state["load"].seconds = time.perf_counter() - began
    state["stop"] = True
    await asyncio.wait(tasks, timeout=120)
    for task in tasks:
        task.cancel()
    return state["load"]  # type: ignore[no-any-return]
