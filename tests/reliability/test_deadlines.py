"""Issue 6, item 6: requests with a 50 ms deadline against a 200 ms model get 504 at
the deadline +- 50 ms, and items that expired while queued are never computed (the
model logs every id it computes, with the time it started)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .harness import Connection, Reply, closed_loop, computed, report, run, serving
from .models import LOG_ENV, Job

pytestmark = pytest.mark.timeout(120)

DEADLINE_MS = 50
CLIENTS = 20
SECONDS = 4.0
SLACK_MS = 25  # from the client's send to the server's reading of the request


def test_a_deadline_answers_504_on_time_and_expired_items_are_never_computed(
    tmp_path: Path,
) -> None:
    log = tmp_path / "computed"
    sent_at: dict[int, float] = {}

    async def exchange(connection: Connection, number: int) -> Reply:
        sent_at[number] = time.monotonic()
        return await connection.post(Job(number), {"x-request-timeout-ms": str(DEADLINE_MS)})

    # One item at a time, 200 ms each, and 20 clients always waiting: nearly every
    # item expires in the queue, a few start in time (and then run past it).
    with serving("slow", env={LOG_ENV: str(log)}) as server:
        tally = run(closed_loop(server.address, CLIENTS, SECONDS, exchange))
    started = computed(log)
    late_ms = {i: 1000 * (at - sent_at[i]) - DEADLINE_MS for i, at in started.items()}
    expired_then_computed = [i for i, late in late_ms.items() if late > SLACK_MS]
    off_ms = [1000 * s - DEADLINE_MS for s in tally.seconds.get(504, [])]
    report(
        "deadlines",
        **tally.figure(),
        p50_ms=tally.p(0.5, 504),
        p99_ms=tally.p(0.99, 504),
        max_ms=tally.p(1.0, 504),
        computed=len(started),
        computed_after_expiring_in_queue=len(expired_then_computed),
    )
    assert tally.lost == 0 and set(tally.statuses) == {504}
    assert all(abs(off) <= 50 for off in off_ms), sorted(off_ms)[-5:]
    assert started, "no item started before its deadline"
    assert not expired_then_computed, sorted(late_ms.values())[-5:]
