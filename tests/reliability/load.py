"""Load for the reliability tests: closed loops (each connection sends one request
after another) and open loops (requests at a fixed rate, on time whatever the server
does), and the tally of what came back.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from .client import HANG_GUARD_S, Connection, Reply

__all__ = ["HUNG_UP", "Exchange", "Outcome", "Tally", "closed_loop", "open_loop", "percentile"]


@dataclass
class Tally:
    """What a load run sent and got back: counts by status, latencies, and lost
    requests (no response at all: a reset, or the hang guard)."""

    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    seconds: dict[int, list[float]] = field(default_factory=dict)
    lost: int = 0
    wrong: list[str] = field(default_factory=list)  # 200s carrying someone else's answer

    def add(self, reply: Reply) -> None:
        self.statuses[reply.status] += 1
        self.seconds.setdefault(reply.status, []).append(reply.seconds)

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    def merge(self, other: Tally) -> None:
        self.sent += other.sent
        self.statuses.update(other.statuses)
        for status, values in other.seconds.items():
            self.seconds.setdefault(status, []).extend(values)
        self.lost += other.lost
        self.wrong.extend(other.wrong)

    def p(self, q: float, status: int = 200) -> float:
        """The ``q`` quantile (0..1) of the latency of ``status`` replies, in ms."""
        return 1000 * percentile(self.seconds.get(status, []), q)

    def figure(self) -> dict[str, object]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "by_status": self.statuses,
            "lost": self.lost,
            "wrong": len(self.wrong),
        }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank quantile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


Exchange = Callable[["Connection", int], Awaitable[Reply]]
"""One request on a connection, given a unique sequence number; returns the reply."""


HUNG_UP = -1
"""The status of a reply an exchange made up after dropping the connection on purpose."""


async def closed_loop(
    address: tuple[str, int],
    clients: int,
    seconds: float,
    exchange: Exchange,
    check: Callable[[int, Reply], str | None] | None = None,
    tally: Tally | None = None,
) -> Tally:
    """``clients`` connections each sending one request after another for ``seconds``.

    Requests are numbered on from ``tally.sent + 1``. ``check(number, reply)``
    returns a complaint about a reply (kept in ``tally.wrong``) or None. A request
    that gets no response is counted lost and its client reconnects.
    """
    tally = tally if tally is not None else Tally()
    sequence = iter(range(tally.sent + 1, 1 << 62))
    until = time.monotonic() + seconds

    async def client() -> None:
        connection: Connection | None = None
        while time.monotonic() < until:
            if connection is None:
                connection = await Connection.open(address)
            number = next(sequence)
            tally.sent += 1
            try:
                reply = await asyncio.wait_for(exchange(connection, number), HANG_GUARD_S)
            except (OSError, asyncio.TimeoutError):
                tally.lost += 1
                connection.abort()
                connection = None
                continue
            tally.add(reply)
            if check is not None and (complaint := check(number, reply)) is not None:
                tally.wrong.append(complaint)
            if reply.headers.get("connection") == "close":
                await connection.close()
                connection = None
        if connection is not None:
            await connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return tally


@dataclass(frozen=True)
class Outcome:
    """One request of an open-loop run: its number, when it was due (seconds from
    the start), its status (0: no response), the seconds from then to its response,
    and from when it was sent (later, if the client was behind) to its response."""

    number: int
    at: float
    status: int
    seconds: float
    round_trip: float
    complaint: str | None = None  # what ``check`` found wrong with the reply


async def open_loop(
    address: tuple[str, int],
    phases: list[tuple[float, float]],
    exchange: Exchange,
    outcomes: list[Outcome],
    connections: int = 200,
    check: Callable[[int, Reply], str | None] | None = None,
) -> None:
    """Send requests at a fixed rate, phase after phase (``(rate per second,
    seconds)``), on time whatever the server does, over ``connections`` connections
    opened first (an arrival that finds them all busy waits for one). Appends one
    :class:`Outcome` per request (with ``check(number, reply)``'s complaint); its
    time counts from when it was due."""
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        idle.put_nowait(await Connection.open(address))
    started = time.monotonic()

    async def one(number: int, at: float) -> None:
        connection = await idle.get()
        try:
            reply = await asyncio.wait_for(exchange(connection, number), HANG_GUARD_S)
        except (OSError, asyncio.TimeoutError):
            late = time.monotonic() - started - at
            outcomes.append(Outcome(number, at, 0, late, late))
            connection.abort()
            idle.put_nowait(await Connection.open(address))
            return
        late = time.monotonic() - started - at
        complaint = None if check is None else check(number, reply)
        outcomes.append(Outcome(number, at, reply.status, late, reply.seconds, complaint))
        if reply.status == HUNG_UP:
            connection = await Connection.open(address)
        idle.put_nowait(connection)

    tasks = []
    phase_start = 0.0
    for rate, seconds in phases:
        for k in range(int(rate * seconds)):
            at = phase_start + k / rate
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(len(tasks) + 1, at)))
        phase_start += seconds
    await asyncio.gather(*tasks)
    while not idle.empty():
        await idle.get_nowait().close()
