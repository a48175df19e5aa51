"""The two ways of offering load: a closed loop and an open (Poisson) loop.

Both send pre-encoded requests (cycled in order) over keep-alive connections and
count every reply and failure into a :class:`~microbatch.bench.results.Tally`.
Each returns once every request it sent has been answered or has timed out.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Iterator, Sequence

from .client import Connection, ConnectionClosed, Endpoint, RequestTimeout
from .parser import ProtocolError
from .results import Tally

__all__ = ["closed_loop", "open_loop"]

clock = time.perf_counter
"""Every time stamp of a run (not ``loop.time()``: uvloop's ticks in whole milliseconds)."""

RECONNECT_PAUSE_S = 0.05
"""Pause after a failed connect, so a refusing server is not hammered in a tight loop."""


async def closed_loop(
    endpoint: Endpoint,
    requests: Sequence[bytes],
    *,
    concurrency: int,
    duration_s: float,
    timeout_s: float,
    tally: Tally,
) -> float:
    """``concurrency`` connections, each sending its next request when its reply arrives,
    until ``duration_s`` has passed; return the seconds from start to the last reply.

    Latency is from writing the request to the reply being complete.
    """
    cycle = itertools.cycle(requests)
    start = clock()
    stop = start + duration_s

    async def caller() -> None:
        connection: Connection | None = None
        try:
            while clock() < stop:
                if connection is None or connection.closed:
                    connection = await _connect(endpoint, tally)
                    if connection is None:
                        continue
                await _send(connection, next(cycle), clock(), timeout_s, tally)
        finally:
            if connection is not None:
                connection.close()

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return clock() - start


async def open_loop(
    endpoint: Endpoint,
    requests: Sequence[bytes],
    *,
    rate: float,
    duration_s: float,
    timeout_s: float,
    max_outstanding: int,
    tally: Tally,
    rng: random.Random,
) -> float:
    """Poisson arrivals at ``rate`` per second for ``duration_s``; return the seconds
    from start to the last reply.

    Each request's latency runs from the moment it was due, not from when it could
    be sent: when ``max_outstanding`` requests are already waiting for replies, the
    next one waits for a free slot and that wait is part of its latency (no
    coordinated omission). Arrivals still waiting for a slot when the run ends are
    counted as :attr:`Tally.unsent`.
    """
    loop = asyncio.get_running_loop()
    cycle = itertools.cycle(requests)
    slots = asyncio.Semaphore(max_outstanding)
    idle: list[Connection] = []
    busy: set[asyncio.Task[None]] = set()
    start = clock()
    stop = start + duration_s
    arrivals = _arrivals(start, rate, rng)

    async def one(due: float, data: bytes) -> None:
        try:
            connection = None
            while idle and connection is None:
                candidate = idle.pop()
                connection = None if candidate.closed else candidate
            if connection is None:
                connection = await _connect(endpoint, tally)
                if connection is None:
                    return
            # From when it was due; or from now if a coarse timer woke us a little early.
            await _send(connection, data, min(due, clock()), timeout_s, tally)
            if not connection.closed:
                idle.append(connection)
        finally:
            slots.release()

    try:
        for due in arrivals:
            if due >= stop:
                break
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if not await _acquire_before(slots, stop - clock()):
                tally.unsent += 1 + sum(
                    1 for _ in itertools.takewhile(lambda t: t < stop, arrivals)
                )
                break
            task = loop.create_task(one(due, next(cycle)))
            busy.add(task)
            task.add_done_callback(busy.discard)
        if busy:
            await asyncio.gather(*busy)
    finally:
        for task in busy:
            task.cancel()
        for connection in idle:
            connection.close()
    return clock() - start


def _arrivals(start: float, rate: float, rng: random.Random) -> Iterator[float]:
    """Due times of a Poisson process of ``rate`` per second from ``start`` on."""
    due = start
    while True:
        due += rng.expovariate(rate)
        yield due


async def _acquire_before(slots: asyncio.Semaphore, within_s: float) -> bool:
    """Take a slot, waiting at most ``within_s``; False when none came free in time."""
    if not slots.locked():
        await slots.acquire()
        return True
    if within_s <= 0:
        return False
    try:
        await asyncio.wait_for(slots.acquire(), within_s)
    except asyncio.TimeoutError:
        return False
    return True


async def _connect(endpoint: Endpoint, tally: Tally) -> Connection | None:
    """A new connection, or None after counting a ``connect`` failure and pausing."""
    try:
        return await endpoint.connect()
    except OSError:
        tally.fail("connect")
        await asyncio.sleep(RECONNECT_PAUSE_S)
        return None


async def _send(
    connection: Connection, data: bytes, since: float, timeout_s: float, tally: Tally
) -> None:
    """One request; count its reply (latency from ``since``) or its failure."""
    try:
        response, at = await connection.request(data, timeout_s)
    except RequestTimeout:
        tally.fail("timeout")
    except ConnectionClosed:
        tally.fail("closed")
    except ProtocolError:
        tally.fail("protocol")
    else:
        tally.reply(response.status, at - since)
