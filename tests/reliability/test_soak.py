"""Issue 6, item 13: soak. Steady load with faults sprinkled in — bad items, malformed
bodies, clients that hang up, short deadlines, and a worker killed every 30 s. The
server's RSS and open file descriptors, and the shared-memory segments of all its
processes, stay flat (< 5% growth after the warm-up); no request is lost.

Runs 30 s in the default run, 300 s under ``pytest --long`` (in CI), or
$MICROBATCH_SOAK_S seconds if set; an hour's soak is

    MICROBATCH_SOAK_S=3600 .venv/bin/python -m pytest --long tests/reliability/test_soak.py

The warm-up, the windows compared, the sampling and the kills scale with the
duration (capped at their 300 s values: 60 s, 30 s, 5 s, every 30 s).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import time
from collections import Counter

import pytest

from .harness import (
    HUNG_UP,
    Connection,
    Outcome,
    Reply,
    Server,
    children,
    eventually,
    fd_count,
    lasting,
    metric,
    open_loop,
    report,
    rss_kib,
    run,
    serving,
    shm_segments,
)
from .models import Job

SOAK_S = float(os.environ.get("MICROBATCH_SOAK_S", lasting(30.0, 300.0)))
WARM_UP_S = min(60.0, SOAK_S / 5)
RATE = 200.0  # requests per second, about a quarter of what this machine serves
KILL_EVERY_S = min(30.0, SOAK_S / 10)
SAMPLE_EVERY_S = min(5.0, SOAK_S / 40)
WINDOW_S = min(30.0, SOAK_S / 8)  # growth compares the first and last WINDOW_S after the warm-up

pytestmark = [pytest.mark.long, pytest.mark.timeout(SOAK_S + 180)]

# What each request is, by its number: mostly good, each fault about 1 in 100.
FAULTS = {"poison": 500, "bad": 500, "malformed": 400, "hang up": HUNG_UP, "deadline": 504}


def kind_of(number: int) -> str:
    roll = random.Random(number).random()
    for k, kind in enumerate(FAULTS):
        if roll < (k + 1) / 100:
            return kind
    return "good"


async def exchange(connection: Connection, number: int) -> Reply:
    kind = kind_of(number)
    if kind == "malformed":
        json = {"content-type": "application/json"}
        return await connection.request("POST", "/predict", b"{", json)
    if kind == "hang up":
        connection.send("POST", "/predict", b'{"id": %d}' % number)
        await asyncio.sleep(random.Random(number).uniform(0, 0.05))
        connection.abort()
        return Reply(HUNG_UP, {}, b"", 0.0)
    headers = {"x-request-timeout-ms": "0.001"} if kind == "deadline" else {}
    job = Job(number, poison=kind == "poison", bad=kind == "bad")
    return await connection.post(job, headers)


def own_answer(number: int, reply: Reply) -> str | None:
    if reply.status == 200 and reply.json() != {"id": number}:
        return f"{number} got {reply.body!r}"
    return None


def allowed(outcome: Outcome) -> bool:
    """Its own expected status, or 503 for a request whose worker was killed."""
    kind = kind_of(outcome.number)
    expected = 200 if kind == "good" else FAULTS[kind]
    if outcome.complaint is not None:
        return False
    return outcome.status == expected or (outcome.status == 503 and expected in (200, 500))


def test_a_soak_with_faults_loses_nothing_and_stays_flat() -> None:
    with serving("steady") as server:
        outcomes: list[Outcome] = []
        samples: list[dict[str, float]] = []
        kills = run(soak(server, outcomes, samples))

        async def both_workers_back() -> bool:
            return await metric(server.address, "microbatch_workers_alive") == 2

        run(eventually(both_workers_back, "both workers serve after the last kill"))
    wrong = [o for o in outcomes if not allowed(o)]
    settled = [s for s in samples if s["at"] >= WARM_UP_S]
    first = [s for s in settled if s["at"] < WARM_UP_S + WINDOW_S]
    last = [s for s in settled if s["at"] >= SOAK_S - WINDOW_S]
    growth = {
        key: (statistics.median(s[key] for s in last) - statistics.median(s[key] for s in first))
        / max(1.0, statistics.median(s[key] for s in first))
        for key in ("rss_kib", "fds", "shm")
    }
    report(
        "soak",
        seconds=SOAK_S,
        sent=len(outcomes),
        by_status=Counter(o.status for o in outcomes),
        kills=kills,
        lost=sum(o.status == 0 for o in outcomes),
        wrong=len(wrong),
        rss_mib=" ".join(
            f"{s['rss_kib'] / 1024:.1f}" for s in samples[:: max(1, len(samples) // 10)]
        ),
        workers_rss_mib=f"{samples[-1]['workers_rss_kib'] / 1024:.1f}",
        fds=f"{min(s['fds'] for s in settled):.0f}..{max(s['fds'] for s in settled):.0f}",
        shm_segments=max(s["shm"] for s in samples),
        growth={key: f"{100 * value:+.1f}%" for key, value in growth.items()},
    )
    assert not wrong, wrong[:5]
    assert kills >= SOAK_S // KILL_EVERY_S - 1
    assert all(value < 0.05 for value in growth.values()), growth


async def soak(server: Server, outcomes: list[Outcome], samples: list[dict[str, float]]) -> int:
    """Open-loop load for SOAK_S; meanwhile sample the processes and kill a worker
    every KILL_EVERY_S. Returns the number of kills."""
    pid = server.process.pid
    load = asyncio.ensure_future(
        open_loop(server.address, [(RATE, SOAK_S)], exchange, outcomes, check=own_answer)
    )
    started = time.monotonic()
    rng = random.Random(13)
    kills = 0
    next_kill = started + KILL_EVERY_S
    while not load.done():
        workers = children(pid)
        samples.append(
            {
                "at": time.monotonic() - started,
                "rss_kib": rss_kib(pid),
                "workers_rss_kib": sum(rss_kib(w) for w in workers),
                "fds": fd_count(pid),
                "shm": sum(shm_segments(p) for p in (pid, *workers)),
            }
        )
        if time.monotonic() >= next_kill and workers:
            os.kill(rng.choice(sorted(workers)), signal.SIGKILL)
            kills += 1
            next_kill += KILL_EVERY_S
        await asyncio.wait({load}, timeout=SAMPLE_EVERY_S)
    await load
    return kills
