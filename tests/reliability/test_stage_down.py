"""Issue 6, item 4: a stage whose only worker dies and then crashes in every setup.
``/health/ready`` turns 503 within 1 s, predict requests get 503 (with Retry-After)
in under 50 ms the whole time, ``/health/live`` stays 200, and the restarts back off.

(A model that crashes in setup from the very start never serves: the server exits
non-zero, see tests/serve/test_server.py.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from .harness import (
    Connection,
    Reply,
    Server,
    children,
    cpu_wait_s,
    get,
    metric,
    percentile,
    report,
    run,
    serving,
)
from .models import MARKER_ENV, Job

pytestmark = pytest.mark.timeout(120)

DURATION = "microbatch_http_request_duration_seconds_bucket"
WATCH_S = 9.0  # long enough for three rounds of setup attempts (pauses 2 s, then 4 s)


def test_a_dead_stage_is_not_ready_fails_fast_and_backs_off(tmp_path: Path) -> None:
    marker = tmp_path / "setup-attempts"
    with serving("fragile", env={MARKER_ENV: str(marker)}) as server:
        marker.touch()  # from now on every setup of the stage's worker crashes
        (worker,) = children(server.process.pid)
        waited = cpu_wait_s(server.process.pid)
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        not_ready_after_s, replies, live = run(watch(server, killed))
        # Server-side, from each request to its 503 having been written.
        fast = run(metric(server.address, DURATION, route="/predict", le="0.05"))
        waited = cpu_wait_s(server.process.pid) - waited
    attempts = [float(line) - killed for line in marker.read_text().split()]
    rounds = setup_rounds(attempts)
    pauses = [b[0] - a[-1] for a, b in pairwise(rounds)]
    seconds = [r.seconds for r in replies]
    report(
        "stage down",
        not_ready_after_s=not_ready_after_s,
        predicts=len(replies),
        by_status=Counter(r.status for r in replies),
        client_p99_ms=1000 * percentile(seconds, 0.99),
        client_max_ms=1000 * max(seconds),
        server_under_50_ms=f"{fast:.0f}/{len(replies)}",
        server_cpu_wait_s=waited,
        live=Counter(live),
        setup_attempts=len(attempts),
        rounds=len(rounds),
        pauses_s=[round(p, 2) for p in pauses],
    )
    assert not_ready_after_s <= 1.0
    assert all(r.status == 503 and r.headers.get("retry-after") for r in replies)
    # Fail-fast is the server's own measure: every 503 written within 50 ms of its
    # request. The client's median must agree; its tail is not asserted: on this
    # shared machine one stall of the client process (once 1.0 s of 76, while the
    # server had 76/76 under 50 ms) says nothing of the server.
    assert fast == len(replies)
    assert percentile(seconds, 0.5) < 0.050
    assert set(live) == {200}
    assert len(rounds) >= 2 and all(b > 1.5 * a for a, b in pairwise(pauses))
    assert pauses[0] >= 1.0  # not a tight loop


async def watch(server: Server, killed: float) -> tuple[float, list[Reply], list[int]]:
    """For WATCH_S after the kill: poll readiness until 503, then send a predict
    request and a liveness probe every 100 ms."""
    while (await get(server.address, "/health/ready")).status == 200:
        assert time.monotonic() - killed < 10, "never turned not ready"
        await asyncio.sleep(0.005)
    not_ready_after_s = time.monotonic() - killed
    connection = await Connection.open(server.address)
    replies: list[Reply] = []
    live: list[int] = []
    number = 0
    while time.monotonic() - killed < WATCH_S:
        number += 1
        replies.append(await connection.post(Job(number)))
        live.append((await get(server.address, "/health/live")).status)
        await asyncio.sleep(0.1)
    await connection.close()
    return not_ready_after_s, replies, live


def setup_rounds(attempts: list[float]) -> list[list[float]]:
    """Group setup attempts into rounds: attempts less than 1 s apart belong together
    (within a round they are 0.1 s apart; rounds are separated by the back-off)."""
    rounds: list[list[float]] = []
    for at in sorted(attempts):
        if rounds and at - rounds[-1][-1] < 1.0:
            rounds[-1].append(at)
        else:
            rounds.append([at])
    return rounds
