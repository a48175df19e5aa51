"""Issue 6, item 12: clients that disconnect mid-request.

* Exact: while one worker computes an item at a time (200 ms each), 24 clients
  queue; 30% of those far enough back to be certainly undispatched hang up. None of
  their items is computed, every other client gets its own answer.
* Under load: 100 clients for three rounds, 30% of requests dropped by the client at
  a random moment; every answered request has its own answer, and the server's open
  file descriptors and RSS are flat from the second round to the third.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import (
    HANG_GUARD_S,
    Connection,
    Server,
    computed,
    eventually,
    fd_count,
    metric,
    report,
    rss_kib,
    run,
    serving,
)
from .models import GATE_ENV, LOG_ENV, Job

pytestmark = pytest.mark.timeout(180)

QUEUED = 24
CERTAINLY_QUEUED_FROM = 4  # running, waiting in the worker's pipe, next: maybe dispatched
CANCELLED = "microbatch_items_dropped_total"


def test_queued_items_of_clients_that_hang_up_are_never_computed(tmp_path: Path) -> None:
    log, gate = tmp_path / "computed", tmp_path / "gate"
    os.mkfifo(gate)
    with serving("gated", env={LOG_ENV: str(log), GATE_ENV: str(gate)}) as server:
        left, answers, cancelled = run(hang_up_while_queued(server, gate))
    done = computed(log)
    report(
        "disconnect while queued",
        clients=QUEUED,
        hung_up=len(left),
        answered=len(answers),
        own_answers=sum(answers[i] == i for i in answers),
        cancelled=cancelled,
        computed_of_those_who_left=len(set(left) & set(done)),
    )
    assert not set(left) & set(done)
    assert cancelled == len(left)
    assert all(answers[i] == i for i in answers) and len(answers) == QUEUED - len(left)


async def hang_up_while_queued(
    server: Server, gate: Path
) -> tuple[list[int], dict[int, int], float]:
    """Queue QUEUED items behind the first (held at the gate), hang up some of them,
    wait until the server has dropped those, then open the gate."""
    connections = [await Connection.open(server.address) for _ in range(QUEUED)]
    replies: dict[int, asyncio.Future[object]] = {}
    for i, connection in enumerate(connections):
        replies[i] = asyncio.ensure_future(connection.post(Job(i)))

        async def queued(count: int = i + 1) -> bool:  # in arrival order
            return await metric(server.address, "microbatch_items_in_service") >= count

        await eventually(queued, f"item {i} is in the service")
    left = sorted(random.Random(12).sample(range(CERTAINLY_QUEUED_FROM, QUEUED), QUEUED * 3 // 10))
    for i in left:
        connections[i].abort()

    async def dropped() -> bool:
        return await metric(server.address, CANCELLED, reason="cancelled") >= len(left)

    await eventually(dropped, "the server dropped the items of those who left")
    await asyncio.wait_for(asyncio.to_thread(open_gate, gate), HANG_GUARD_S)
    answers = {}
    for i, reply in replies.items():
        if i not in left:
            answers[i] = (await reply).json()["id"]  # type: ignore[attr-defined]
    for i in left:
        replies[i].cancel()
    cancelled = await metric(server.address, CANCELLED, reason="cancelled")
    return left, answers, cancelled


def open_gate(gate: Path) -> None:
    """Open the named pipe for writing and close it: the worker's read ends."""
    os.close(os.open(gate, os.O_WRONLY))


CLIENTS = 100
ROUND_S = 3.0
ROUNDS = 3


def test_random_hang_ups_leak_no_file_descriptors_or_memory(tmp_path: Path) -> None:
    with serving("queueing") as server:
        rounds = run(rounds_of_hang_ups(server))
    fds = [r["fds"] for r in rounds]
    rss = [r["rss_kib"] for r in rounds]
    report(
        "random hang-ups",
        sent=sum(r["sent"] for r in rounds),
        hung_up=sum(r["hung_up"] for r in rounds),
        answered=sum(r["answered"] for r in rounds),
        wrong=sum(r["wrong"] for r in rounds),
        cancelled_in_queue=rounds[-1]["cancelled"],
        fds_after_each_round=fds,
        rss_mib_after_each_round=[round(kib / 1024, 1) for kib in rss],
    )
    assert all(r["wrong"] == 0 for r in rounds)
    assert rounds[-1]["cancelled"] > 0
    # Back to where it was after the first round (give or take the connections of
    # this test's own probes; a leak would be hundreds: 700 hang-ups a round).
    assert max(fds[1:]) <= fds[0] + 2
    assert rss[-1] <= 1.05 * rss[1]


async def rounds_of_hang_ups(server: Server) -> list[dict[str, float]]:
    rng = random.Random(1212)
    numbers = iter(range(1, 1 << 62))
    pid = server.process.pid
    found = []
    for _ in range(ROUNDS):
        counts = {"sent": 0, "hung_up": 0, "answered": 0, "wrong": 0}
        until = time.monotonic() + ROUND_S
        await asyncio.gather(*(client(server, rng, numbers, until, counts) for _ in range(CLIENTS)))

        async def idle() -> bool:
            return await metric(server.address, "microbatch_items_in_service") == 0

        await eventually(idle, "the service is empty")
        if found:  # wait (bounded) for the hung-up connections to be closed

            async def closed(baseline: float = found[0]["fds"]) -> bool:
                return fd_count(server.process.pid) <= baseline + 2

            await eventually(closed, "the file descriptors are back to the first round's", 15)
        cancelled = await metric(server.address, CANCELLED, reason="cancelled")
        found.append(
            {**counts, "fds": fd_count(pid), "rss_kib": rss_kib(pid), "cancelled": cancelled}
        )
    return found


async def client(
    server: Server,
    rng: random.Random,
    numbers: Iterator[int],
    until: float,
    counts: dict[str, int],
) -> None:
    """One request per connection; 30% of them dropped after 0-300 ms."""
    while time.monotonic() < until:
        number = next(numbers)
        connection = await Connection.open(server.address)
        counts["sent"] += 1
        request = asyncio.ensure_future(connection.post(Job(number)))
        if rng.random() < 0.3:
            await asyncio.sleep(rng.uniform(0, 0.3))
            connection.abort()
            request.cancel()
            counts["hung_up"] += 1
            continue
        reply = await asyncio.wait_for(request, 30)
        counts["answered"] += 1
        counts["wrong"] += reply.status != 200 or reply.json() != {"id": number}
        await connection.close()
