"""Issue 6, item 5: overload.

A model blocked for 2 s under twice the service's bound: exactly the excess
requests get 503 with Retry-After, fast (p99 < 10 ms), and the accepted ones
complete. Twice the capacity for 60 s (10 s in the default run; 60 s under
``pytest --long``): the only errors are 503s, the server's RSS grows < 10%, and
latency is back to normal within 5 s after the load drops.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from .harness import (
    Connection,
    Outcome,
    Reply,
    closed_loop,
    eventually,
    lasting,
    metric,
    open_loop,
    percentile,
    report,
    rss_kib,
    run,
    sampling_rss,
    serving,
)
from .models import Job

pytestmark = pytest.mark.timeout(240)

BOUND = 100  # max_in_flight of tests.reliability.models:blocked
FAST = "microbatch_http_request_duration_seconds_bucket"


def test_exactly_the_excess_gets_a_fast_503_and_the_accepted_complete() -> None:
    with serving("blocked") as server:
        accepted, excess = run(over_the_bound(server.address))
        fast = run(metric(server.address, FAST, route="/predict", le="0.01"))
    refused = [r for r in excess if r.status == 503]
    refused_ms = [1000 * r.seconds for r in refused]
    report(
        "blocked model, 2x the bound",
        accepted=Counter(r.status for r in accepted),
        excess=Counter(r.status for r in excess),
        retry_after=Counter(r.headers.get("retry-after") for r in refused),
        client_p99_ms=percentile(refused_ms, 0.99),
        client_max_ms=max(refused_ms),
        server_under_10_ms=f"{fast:.0f}/{len(refused)}",
    )
    assert [r.status for r in accepted] == [200] * BOUND
    assert [r.json()["id"] for r in accepted] == list(range(BOUND))
    assert len(refused) == BOUND and all(r.headers.get("retry-after") for r in refused)
    # The accepted took 2 s or more: every answer under 10 ms server-side is a 503.
    assert fast >= 0.99 * BOUND
    assert percentile(refused_ms, 0.99) < 10


async def over_the_bound(address: tuple[str, int]) -> tuple[list[Reply], list[Reply]]:
    """BOUND requests fill the service while the model blocks; BOUND more, ten at a
    time on warm connections, find it full."""
    connections = [await Connection.open(address) for _ in range(BOUND)]
    inside = [asyncio.ensure_future(c.post(Job(i))) for i, c in enumerate(connections)]

    async def full() -> bool:
        return await metric(address, "microbatch_items_in_service") == BOUND

    await eventually(full, "the service is full")
    spare = [await Connection.open(address) for _ in range(10)]
    for connection in spare:  # warm: a first exchange on each
        await connection.request("GET", "/health/live")
    excess: list[Reply] = []
    for wave in range(BOUND // len(spare)):
        ids = range(BOUND + wave * len(spare), BOUND + (wave + 1) * len(spare))
        excess += await asyncio.gather(*(c.post(Job(i)) for c, i in zip(spare, ids, strict=True)))
    accepted = list(await asyncio.gather(*inside))
    for connection in connections + spare:
        await connection.close()
    return accepted, excess


WARM_S, BASELINE_S, OVERLOAD_S, RECOVERY_S = 1.0, 3.0, lasting(10.0, 60.0), 8.0
BACK_WITHIN_S = 5.0


@pytest.mark.long
def test_twice_the_capacity_sheds_with_503_in_bounded_memory() -> None:
    with serving("limited") as server:
        capacity = run(measure_capacity(server.address))
        rss_before_bursts = rss_kib(server.process.pid)
        run(bursts(server.address))
        outcomes: list[Outcome] = []
        low, high = capacity / 2, 2 * capacity
        phases = [(low, WARM_S + BASELINE_S), (high, OVERLOAD_S), (low, RECOVERY_S)]
        with sampling_rss(server, every_s=0.5) as rss:
            started = time.monotonic()
            run(open_loop(server.address, phases, exchange, outcomes))
    rose = WARM_S + BASELINE_S  # when the load rises to twice the capacity
    dropped = rose + OVERLOAD_S  # and when it drops back
    baseline = ok_seconds(outcomes, WARM_S, rose)
    overload = [o for o in outcomes if rose <= o.at < dropped]
    recovered = ok_seconds(outcomes, dropped + BACK_WITHIN_S, dropped + RECOVERY_S)
    in_overload = rss.between(started + rose, started + dropped)
    growth = (max(in_overload) - in_overload[0]) / in_overload[0]
    medians = [
        round(1000 * percentile(ok_seconds(outcomes, dropped + k, dropped + k + 1), 0.5), 1)
        for k in range(int(RECOVERY_S))
    ]
    report(
        f"2x capacity for {OVERLOAD_S:.0f} s",
        capacity_per_s=capacity,
        sent=len(overload),
        by_status=Counter(o.status for o in overload),
        ok_per_s=sum(o.status == 200 for o in overload) / OVERLOAD_S,
        lost=sum(o.status == 0 for o in outcomes),
        rss_mib_before_the_bursts=rss_before_bursts / 1024,
        rss_mib_every_10_s=" ".join(f"{kib / 1024:.1f}" for kib in in_overload[::20]),
        rss_growth=f"{100 * growth:.1f}%",
        baseline_p50_p99_ms=p50_p99(baseline),
        after_5_s_p50_p99_ms=p50_p99(recovered),
        p50_ms_per_second_after_the_drop=medians,
    )
    assert all(o.status in (200, 503) for o in outcomes)
    assert sum(o.status == 503 for o in overload) > 0.3 * len(overload)
    assert growth < 0.10
    # Latency is back to normal: from 5 s after the drop, the median round trip is
    # within 1.5x of the baseline's (p99 is printed; on a shared 2-core machine a
    # few slow samples in a second decide it).
    assert percentile(recovered, 0.5) <= 1.5 * percentile(baseline, 0.5)


async def exchange(connection: Connection, number: int) -> Reply:
    return await connection.post(Job(number))


async def measure_capacity(address: tuple[str, int]) -> float:
    """Items per second the model serves when kept busy (30 clients: under the
    service's bound of 40, so none is refused)."""
    await closed_loop(address, 30, 1.0, exchange)  # warm up
    tally = await closed_loop(address, 30, 3.0, exchange)
    assert set(tally.statuses) == {200}
    return tally.statuses[200] / 3.0


async def bursts(address: tuple[str, int], clients: int = 200, rounds: int = 20) -> None:
    """Rounds of ``clients`` requests at once: the most the load generator ever has
    in flight. Memory grows to a plateau under such bursts (freed objects leave
    their allocator pages partly used) and then stays there; reaching it first
    makes the RSS growth measured under overload the growth that lasts."""
    connections = [await Connection.open(address) for _ in range(clients)]
    for _ in range(rounds):
        await asyncio.gather(*(c.post(Job(i)) for i, c in enumerate(connections)))
    for connection in connections:
        await connection.close()


def ok_seconds(outcomes: list[Outcome], since: float, until: float) -> list[float]:
    """Round trips of the 200s due in [since, until) (from their sending: the load
    generator shares the machine and is sometimes late)."""
    return [o.round_trip for o in outcomes if since <= o.at < until and o.status == 200]


def p50_p99(seconds: list[float]) -> str:
    return f"{1000 * percentile(seconds, 0.5):.1f}/{1000 * percentile(seconds, 0.99):.1f}"
