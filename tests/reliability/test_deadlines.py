"""Issue 6, item 6: requests with a 50 ms deadline against a 200 ms model get 504 at
the deadline +- 50 ms, and items that expired while queued are never computed (the
model logs every id it computes, with the time it started)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from .harness import (
    Connection,
    Reply,
    closed_loop,
    computed,
    cpu_wait_s,
    metric,
    report,
    run,
    serving,
)
from .models import LOG_ENV, Job

pytestmark = pytest.mark.timeout(120)

DEADLINE_MS = 50
CLIENTS = 10
SECONDS = 4.0
DURATION = "microbatch_http_request_duration_seconds_bucket"


def test_a_deadline_answers_504_on_time_and_expired_items_are_never_computed(
    tmp_path: Path,
) -> None:
    log = tmp_path / "computed"
    answered_at: dict[int, float] = {}

    async def exchange(connection: Connection, number: int) -> Reply:
        reply = await connection.post(Job(number), {"x-request-timeout-ms": str(DEADLINE_MS)})
        answered_at[number] = time.monotonic()
        return reply

    # One item at a time, 200 ms each, and 10 clients always waiting: nearly every
    # item expires in the queue, a few start in time (and then run past it).
    with serving("slow", env={LOG_ENV: str(log)}) as server:
        waited = cpu_wait_s(server.process.pid)
        tally = run(closed_loop(server.address, CLIENTS, SECONDS, exchange))
        waited = cpu_wait_s(server.process.pid) - waited
        # Server-side, each answer's time from its request to its response
        # (client-side times add the load generator's own delays on a busy machine).
        in_time = run(metric(server.address, DURATION, route="/predict", le="0.1"))
    # An item that started after its caller got the 504 had expired before it
    # started (the server answers at the deadline).
    started = computed(log)
    expired_then_computed = [i for i, at in started.items() if at > answered_at[i]]
    off_ms = [1000 * s - DEADLINE_MS for s in tally.seconds.get(504, [])]
    report(
        "deadlines",
        **tally.figure(),
        client_p50_ms=tally.p(0.5, 504),
        client_p99_ms=tally.p(0.99, 504),
        client_max_ms=tally.p(1.0, 504),
        server_within_deadline_plus_50_ms=f"{in_time:.0f}/{tally.answered}",
        server_cpu_wait_s=waited,
        computed=len(started),
        computed_after_expiring_in_queue=len(expired_then_computed),
    )
    assert tally.lost == 0 and set(tally.statuses) == {504}
    assert in_time >= 0.99 * tally.answered
    assert abs(statistics.median(off_ms)) <= 50
    assert started, "no item started before its deadline"
    assert not expired_then_computed
