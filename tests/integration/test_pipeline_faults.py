"""Faults under load: many callers through three process stages while workers are
killed with SIGKILL, items fail at random, callers cancel and deadlines pass.
Every caller must get exactly its own answer, and nothing may outlive the service."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from microbatch import BatchConfig, DeadlineExceeded
from microbatch.errors import RemoteError, StageFailed, WorkerDied
from microbatch.pipeline import Service, Stage
from tests.integration.pipeline_models import Flaky
from tests.integration.test_pipeline_lifecycle import children, eventually

pytestmark = pytest.mark.timeout(180)

SALTS = (11, 23, 37)
ONE_IN = (13, 17, 19)


def expected(x: int) -> int | str:
    """The answer for ``x``: x + 3, or the message of the stage that fails it."""
    for salt, one_in in zip(SALTS, ONE_IN, strict=True):
        if hash((salt, x)) % one_in == 0:
            return f"unlucky {x}"
        x += 1
    return x


def pipeline(idempotent_middle: bool) -> Service:
    settings = BatchConfig(max_batch_size=16, max_latency_ms=2)
    return Service(
        *(
            Stage(
                Flaky,
                workers=2,
                batching=settings,
                name=f"stage{k}",
                args=(salt, one_in),
                idempotent=idempotent_middle and k == 1,
            )
            for k, (salt, one_in) in enumerate(zip(SALTS, ONE_IN, strict=True))
        ),
        examples=[0],
    )


async def caller(service: Service, rng: random.Random, first: int, until: float) -> list[Any]:
    """Submit distinct items one after another; record (item, outcome) pairs."""
    records: list[Any] = []
    x = first
    while time.monotonic() < until:
        x += 1
        roll = rng.random()
        task = asyncio.ensure_future(
            service.submit(x, timeout_s=rng.uniform(0.001, 0.02) if roll < 0.1 else 5.0)
        )
        if 0.1 <= roll < 0.15:
            await asyncio.sleep(rng.uniform(0, 0.003))
            task.cancel()
        try:
            records.append((x, await task))
        except asyncio.CancelledError:
            records.append((x, "cancelled"))
        except Exception as exc:
            records.append((x, exc))
    return records


def check(records: list[Any]) -> dict[str, int]:
    """Every outcome is the item's own answer or an allowed fault; count them."""
    counts = {
        "ok": 0,
        "item error": 0,
        "worker died": 0,
        "stage down": 0,
        "deadline": 0,
        "cancelled": 0,
    }
    for x, outcome in records:
        want = expected(x)
        if outcome == "cancelled":
            counts["cancelled"] += 1
        elif isinstance(outcome, WorkerDied):
            counts["worker died"] += 1
        elif isinstance(outcome, StageFailed):  # both workers of a stage were down
            counts["stage down"] += 1
        elif isinstance(outcome, DeadlineExceeded):
            counts["deadline"] += 1
        elif isinstance(outcome, RemoteError):
            assert outcome.message == want, (x, outcome)
            counts["item error"] += 1
        else:
            assert outcome == want, (x, outcome)
            counts["ok"] += 1
    return counts


@pytest.mark.parametrize("idempotent_middle", [False, True])
async def test_kill_storm_through_three_stages_answers_everyone(idempotent_middle: bool) -> None:
    rng = random.Random(20261121)
    service = pipeline(idempotent_middle)
    async with service:
        until = time.monotonic() + 4.0
        callers = [
            asyncio.create_task(caller(service, random.Random(i), i * 1_000_000, until))
            for i in range(24)
        ]
        kills = 0
        while time.monotonic() < until - 0.5:
            await asyncio.sleep(0.3)
            pids = [pid for pool in service.pools for pid in pool.pids]
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
                kills += 1
        records = [record for task in callers for record in await task]
        # Restarts back off after a storm of kills: a generous hang guard, not a timing claim.
        await eventually(lambda: all(pool.alive == 2 for pool in service.pools), timeout_s=30.0)
        restarts = sum(pool.restarts for pool in service.pools)
        assert service.ready and service.stats().in_flight == 0
        answers = check(records)
        print(f"\nkills={kills} restarts={restarts} requests={len(records)} {answers}")
        # The workers that came back serve correctly.
        xs = range(10**8, 10**8 + 200)
        fresh = await asyncio.gather(*(service.submit(x) for x in xs), return_exceptions=True)
    # A worker killed while it was still starting is started again by the same restart.
    assert kills >= 8 and 1 <= restarts <= kills
    # A stage with both workers down refuses at once, so callers ask again fast while
    # it restarts: failures are cheap and many, so their share says little. Every
    # request was answered (check), and the service kept answering correctly.
    assert answers["ok"] >= 1000
    after = check(list(zip(xs, fresh, strict=True)))
    assert after["ok"] + after["item error"] == 200
    assert not children()


def test_workers_exit_when_the_serving_process_is_killed() -> None:
    root = Path(__file__).resolve().parents[2]
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.serve_forever"],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        pids = [int(pid) for pid in server.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        server.kill()
        server.wait(timeout=10)
    deadline = time.monotonic() + 10  # a hang guard, not a timing claim
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)  # the pipe closed: they left on their own


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
