"""Issue 6, item 7: SIGTERM under load. Readiness turns 503 (or the listener
closes) within 100 ms; every request sent before the signal completes with its own
answer; the process exits 0 within the grace period + 2 s; no worker outlives it."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from .harness import Connection, Server, alive, children, get, report, run, serving
from .models import Job

pytestmark = pytest.mark.timeout(120)

CLIENTS = 200
LOAD_S = 3.0  # before the signal
GRACE_S = 10.0


def test_sigterm_under_load_finishes_what_was_accepted_and_exits_in_time() -> None:
    with serving("draining", "--graceful-timeout-s", str(GRACE_S)) as server:
        workers = children(server.process.pid)
        before, after, not_ready_after_s, exited_after_s = run(terminate_under_load(server))
        exit_code = server.process.returncode
    orphans = [pid for pid in workers if alive(pid)]
    report(
        "sigterm under load",
        sent_before=len(before),
        before=Counter(before.values()),
        after=Counter(after.values()),
        not_ready_after_ms=1000 * not_ready_after_s,
        exited_after_s=exited_after_s,
        exit_code=exit_code,
        orphans=len(orphans),
    )
    assert set(before.values()) == {200}, Counter(before.values())
    assert set(after.values()) <= {503, "refused", "closed"}
    assert not_ready_after_s <= 0.100
    assert exit_code == 0 and exited_after_s <= GRACE_S + 2
    assert not orphans and len(workers) == 2


async def terminate_under_load(
    server: Server,
) -> tuple[dict[int, int | str], dict[int, int | str], float, float]:
    """CLIENTS clients send requests one after another; after LOAD_S, SIGTERM.
    Outcomes of the requests sent before and after the signal, by request number:
    a status, "closed" (no response on a connection the server closed) or "refused"."""
    before: dict[int, int | str] = {}
    after: dict[int, int | str] = {}
    signalled = asyncio.Event()
    signalled_at = 0.0
    numbers = iter(range(1, 1 << 62))

    async def client() -> None:
        connection: Connection | None = None
        while True:
            number = next(numbers)
            sent_at = time.monotonic()
            outcomes = after if signalled.is_set() else before
            try:
                if connection is None:
                    connection = await Connection.open(server.address)
                reply = await asyncio.wait_for(connection.post(Job(number)), 30)
            except ConnectionRefusedError:
                outcomes[number] = "refused"
                return
            except (OSError, asyncio.TimeoutError):
                # Sent before the signal, yet unanswered: lost, unless the send
                # raced the signal itself.
                late = signalled.is_set() and sent_at >= signalled_at
                (after if late else before)[number] = "closed"
                return
            outcomes[number] = reply.status
            if reply.status != 200 or signalled.is_set():
                await connection.close()
                break
        # One more, on a new connection, once the server is shutting down.
        number = next(numbers)
        try:
            fresh = await Connection.open(server.address)
        except OSError:  # refused, or reset while the listener closed
            after[number] = "refused"
            return
        try:
            after[number] = (await asyncio.wait_for(fresh.post(Job(number)), 30)).status
        except (OSError, asyncio.TimeoutError):
            after[number] = "closed"
        finally:
            fresh.abort()

    clients = [asyncio.ensure_future(client()) for _ in range(CLIENTS)]
    await asyncio.sleep(LOAD_S)
    server.process.terminate()
    signalled_at = time.monotonic()
    signalled.set()
    not_ready_after_s = await until_not_ready(server, signalled_at)
    await asyncio.gather(*clients)
    exit_code = await asyncio.get_running_loop().run_in_executor(None, server.process.wait, 30)
    assert exit_code is not None
    return before, after, not_ready_after_s, time.monotonic() - signalled_at


async def until_not_ready(server: Server, since: float) -> float:
    """Seconds from ``since`` until readiness is not 200 (503, or refused)."""
    while True:
        try:
            if (await get(server.address, "/health/ready")).status != 200:
                break
        except OSError:
            break
        assert time.monotonic() - since < 5, "still ready 5 s after SIGTERM"
    return time.monotonic() - since
