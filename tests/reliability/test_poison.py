"""Issue 6, item 2: 1000 batches with random bad items among the good ones. Every bad
item gets its own error (400, 422 or 500, with a message), and no good item fails.

Bad items: a body that is not JSON (400), one that is not a Job (422), a job that
makes the model raise for its whole batch (poison: the batch is bisected inside the
worker, 500 for that item only), and one the model returns an error for (500).
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from .harness import Connection, Reply, Tally, closed_loop, metric, report, run, serving
from .models import Job

pytestmark = pytest.mark.timeout(180)

BATCHES = 1000
CLIENTS = 32
KINDS = ("good",) * 16 + ("malformed", "invalid", "poison", "bad")
EXPECTED = {"good": 200, "malformed": 400, "invalid": 422, "poison": 500, "bad": 500}


def kind_of(number: int) -> str:
    return random.Random(number).choice(KINDS)


async def exchange(connection: Connection, number: int) -> Reply:
    kind = kind_of(number)
    if kind == "malformed":
        headers = {"content-type": "application/json"}
        return await connection.request("POST", "/predict", b'{"id": ' + b"1" * 5, headers)
    if kind == "invalid":
        return await connection.post({"id": f"not a number {number}"})
    return await connection.post(Job(number, poison=kind == "poison", bad=kind == "bad"))


def check(number: int, reply: Reply) -> str | None:
    kind = kind_of(number)
    body = reply.json()
    if reply.status != EXPECTED[kind]:
        return f"{kind} {number}: {reply.status} {body}"
    if kind == "good" and body != {"id": number}:
        return f"good {number} got {body}"
    if kind != "good" and not (body.get("error") and body.get("message")):
        return f"{kind} {number}: no error and message in {body}"
    return None


def test_bad_items_fail_alone_in_a_thousand_batches() -> None:
    with serving("poison") as server:
        tally, batches = run(until_batches(server.address))
    kinds = Counter(kind_of(n) for n in range(1, tally.sent + 1))
    report(
        "poison isolation",
        **tally.figure(),
        batches=batches,
        kinds=kinds,
        good_failed=sum(1 for w in tally.wrong if w.startswith("good")),
    )
    assert batches >= BATCHES
    assert tally.lost == 0 and not tally.wrong, tally.wrong[:5]
    assert tally.answered == tally.sent and kinds["poison"] > 0


async def until_batches(address: tuple[str, int]) -> tuple[Tally, float]:
    """Closed-loop load in 2 s rounds until the service has run BATCHES batches."""
    tally = Tally()
    batches = 0.0
    give_up = time.monotonic() + 120
    while batches < BATCHES:
        assert time.monotonic() < give_up, f"only {batches} batches"
        await closed_loop(address, CLIENTS, 2.0, exchange, check, tally)
        batches = await metric(address, "microbatch_batches_total")
    return tally, batches
