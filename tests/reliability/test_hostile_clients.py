"""Issue 6, item 8: slow and hostile clients.

Slowloris connections are cut off within the header timeout while normal clients'
p99 stays within 2x of what it was without them; oversized, malformed, deeply
nested and compressed bodies are refused with 4xx, and the server's memory stays
bounded by the body limit.
"""

from __future__ import annotations

import asyncio
import gzip
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from .harness import (
    HANG_GUARD_S,
    Connection,
    Reply,
    Tally,
    closed_loop,
    cpu_wait_s,
    report,
    run,
    sampling_rss,
    serving,
)

pytestmark = pytest.mark.timeout(180)

HEADER_TIMEOUT_S = 2.0
SLOW_CLIENTS = 150
NORMAL_CLIENTS = 20
PHASE_S = 3.0
MAX_BODY = 10 * 1024 * 1024
MIB = 1024 * 1024


async def echo_once(connection: Connection, number: int) -> Reply:
    return await connection.post({"n": number})


def own_answer(number: int, reply: Reply) -> str | None:
    ok = reply.status == 200 and reply.json() == {"n": number}
    return None if ok else f"{number}: {reply.status} {reply.body[:80]!r}"


def test_slowloris_is_cut_off_within_the_header_timeout_and_others_keep_their_p99() -> None:
    with serving("echo", "--header-timeout-s", str(HEADER_TIMEOUT_S)) as server:
        waited = cpu_wait_s(server.process.pid)
        before, during, (cut_after_s, replies) = run(phases(server.address))
        waited = cpu_wait_s(server.process.pid) - waited
    ratio = during.p(0.99) / before.p(0.99)
    report(
        "slowloris",
        normal_before_and_after=before.figure(),
        normal_during=during.figure(),
        p99_before_and_after_ms=before.p(0.99),
        p99_during_ms=during.p(0.99),
        ratio=ratio,
        slow_connections=len(cut_after_s),
        slow_replies=Counter(replies),
        cut_after_max_s=max(cut_after_s),
        server_cpu_wait_s=waited,
    )
    for tally in (before, during):
        assert tally.lost == 0 and not tally.wrong and set(tally.statuses) == {200}
    assert set(replies) == {408}
    assert max(cut_after_s) <= HEADER_TIMEOUT_S + 0.5
    assert ratio <= 2.0


async def phases(address: tuple[str, int]) -> tuple[Tally, Tally, tuple[list[float], list[int]]]:
    """Normal load alone, then with SLOW_CLIENTS slowloris connections, then alone
    again (the baseline is both: the machine's other load drifts). A process of
    their own keeps the slow connections open (each opened again as soon as the
    server cuts it off), so that they do not slow the normal clients' side down."""
    before = await closed_loop(address, NORMAL_CLIENTS, PHASE_S, echo_once, own_answer)
    results, results_in = multiprocessing.get_context("spawn").Pipe(duplex=False)
    attacker = multiprocessing.get_context("spawn").Process(
        target=slowloris_main,
        args=(address, PHASE_S + 2 * HEADER_TIMEOUT_S, results_in),
        daemon=True,
    )
    attacker.start()
    loop = asyncio.get_running_loop()
    try:
        assert await loop.run_in_executor(None, results.poll, HANG_GUARD_S), "no attacker"
        assert results.recv() == "connected"
        during = await closed_loop(address, NORMAL_CLIENTS, PHASE_S, echo_once, own_answer)
        assert await loop.run_in_executor(None, results.poll, HANG_GUARD_S), "no results"
        found: tuple[list[float], list[int]] = results.recv()
    finally:
        attacker.join(HANG_GUARD_S)
        if attacker.is_alive():
            attacker.kill()
    await closed_loop(address, NORMAL_CLIENTS, PHASE_S, echo_once, own_answer, before)
    return before, during, found


def slowloris_main(address: tuple[str, int], seconds: float, results: Any) -> None:
    """The attacker process: SLOW_CLIENTS slowloris connections for ``seconds``;
    says "connected" once all are open, then sends (seconds to each cut-off, status)."""
    results.send(run(slowloris(address, seconds, results)))


async def slowloris(
    address: tuple[str, int], seconds: float, results: Any
) -> tuple[list[float], list[int]]:
    cut_after_s: list[float] = []
    statuses: list[int] = []
    until = time.monotonic() + seconds
    opened = 0

    def connected() -> None:
        nonlocal opened
        opened += 1
        if opened == SLOW_CLIENTS:
            results.send("connected")

    async def one(k: int) -> None:
        # Opened one after another over a header timeout, as an attacker keeping
        # SLOW_CLIENTS connections open would: the server cuts one off at a time.
        await asyncio.sleep(k * HEADER_TIMEOUT_S / SLOW_CLIENTS)
        while time.monotonic() < until:
            seconds, status = await slow_headers(address, connected)
            cut_after_s.append(seconds)
            statuses.append(status)

    await asyncio.gather(*(one(k) for k in range(SLOW_CLIENTS)))
    return cut_after_s, statuses


async def slow_headers(
    address: tuple[str, int], connected: Callable[[], None] = lambda: None
) -> tuple[float, int]:
    """Send a request's headers one byte every 0.5 s until the server answers or
    closes; return the seconds that took and the status (0: closed, no answer)."""
    opened = time.monotonic()
    connection = await Connection.open(address)
    connected()
    connection.writer.write(b"POST /predict HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ")
    reply = asyncio.ensure_future(connection.read_reply(opened))
    try:
        while time.monotonic() - opened < HANG_GUARD_S:
            done, _ = await asyncio.wait({reply}, timeout=0.5)
            if done:
                break
            connection.writer.write(b"x")
        try:
            status = (await asyncio.wait_for(reply, 0)).status
        except ConnectionResetError:
            status = 0
        return time.monotonic() - opened, status
    finally:
        await connection.close()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


HOSTILE_BODIES: dict[str, tuple[bytes, dict[str, str], set[int]]] = {
    "malformed json": (b'{"n": ', {"content-type": "application/json"}, {400}),
    "malformed msgpack": (b"\xc1", {"content-type": "application/msgpack"}, {400}),
    "json nested 10000 deep": (nested(10_000), {"content-type": "application/json"}, {400, 422}),
    "msgpack nested 10000 deep": (
        b"\x91" * 10_000 + b"\xc0",
        {"content-type": "application/msgpack"},
        {400, 422},
    ),
    # Compression is not accepted: the bytes are never inflated, so a bomb is just
    # a malformed body (or an unsupported media type).
    "gzip bomb (1 GiB)": (
        gzip.compress(b" " * (1024 * MIB), compresslevel=1),
        {"content-type": "application/json", "content-encoding": "gzip"},
        {400, 413, 415},
    ),
    "zip bomb as application/zip": (
        gzip.compress(b"0" * (64 * MIB), compresslevel=1),
        {"content-type": "application/zip"},
        {415},
    ),
}


def test_hostile_bodies_get_4xx_and_memory_stays_bounded() -> None:
    with serving("echo") as server, sampling_rss(server) as rss:
        statuses = run(send_hostile(server.address))
    growth_mib = (max(rss.samples) - rss.samples[0]) / 1024
    after_mib = (rss.samples[-1] - rss.samples[0]) / 1024
    streamed = Counter(status for name, status in statuses.items() if name.startswith("20 MiB s"))
    named = {name: status for name, status in statuses.items() if not name.startswith("20 MiB s")}
    report(
        "hostile bodies",
        statuses=named,
        streamed_20_mib_chunked=streamed,
        rss_start_mib=rss.samples[0] / 1024,
        rss_peak_growth_mib=growth_mib,
        rss_growth_after_mib=after_mib,
    )
    for name, (_, _, allowed) in HOSTILE_BODIES.items():
        assert statuses[name] in allowed, (name, statuses[name])
    assert statuses["20 MiB declared"] == 413 and statuses["1 MiB of headers"] == 431
    assert streamed == {413: 3 * UPLOADS}
    # At most UPLOADS bodies are buffered at once, each cut off at the limit.
    assert growth_mib < UPLOADS * (MAX_BODY / MIB + 1) + 32


UPLOADS = 4


async def send_hostile(address: tuple[str, int]) -> dict[str, int]:
    statuses: dict[str, int] = {}
    for name, (body, headers, _) in HOSTILE_BODIES.items():
        connection = await Connection.open(address)
        statuses[name] = (await connection.request("POST", "/predict", body, headers)).status
        await connection.close()
    statuses["20 MiB declared"] = await declared_but_not_sent(address, 20 * MIB)
    statuses["1 MiB of headers"] = await big_headers(address, MIB)
    for wave in range(3):
        uploads = [streamed(address, 20 * MIB) for _ in range(UPLOADS)]
        for k, status in enumerate(await asyncio.gather(*uploads)):
            statuses[f"20 MiB streamed {wave}.{k}"] = status
    return statuses


async def declared_but_not_sent(address: tuple[str, int], size: int) -> int:
    connection = await Connection.open(address)
    try:
        connection.writer.write(
            b"POST /predict HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            + f"content-length: {size}\r\n\r\n".encode()
        )
        return (await connection.read_reply(time.perf_counter())).status
    finally:
        connection.abort()


def test_headers_just_over_64_kib_get_431() -> None:
    with serving("echo") as server:
        status = run(big_headers(server.address, 70_000))
    report("headers of 70,000 bytes", status=status)
    assert status == 431


async def big_headers(address: tuple[str, int], size: int) -> int:
    """A request with ``size`` bytes of headers, sent at once; its status (0: reset)."""
    connection = await Connection.open(address)
    try:
        lines = {f"x-filler-{i}": "y" * 1000 for i in range(size // 1000)}
        return (await connection.request("POST", "/predict", b"{}", lines)).status
    except ConnectionResetError:
        return 0
    finally:
        connection.abort()


async def streamed(address: tuple[str, int], size: int) -> int:
    """A chunked body of ``size`` bytes, sent until the server answers."""
    connection = await Connection.open(address)
    connection.writer.write(
        b"POST /predict HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    reply = asyncio.ensure_future(connection.read_reply(time.perf_counter()))
    chunk = b"%x\r\n" % (64 * 1024) + b" " * (64 * 1024) + b"\r\n"
    try:
        for _ in range(size // (64 * 1024)):
            if reply.done():
                break
            connection.writer.write(chunk)
            await connection.writer.drain()
    except ConnectionResetError:
        pass  # the server stopped reading; its answer may be waiting
    try:
        return (await asyncio.wait_for(reply, HANG_GUARD_S)).status
    except ConnectionResetError:
        return 0  # reset before any answer
    finally:
        connection.abort()


def test_a_body_refused_early_does_not_spoil_the_connection() -> None:
    """After a 413 for a body still streaming in, the rest of it is not taken for
    the next request's headers: the connection serves the next request."""
    with serving("echo", "--max-body-bytes", str(MIB)) as server:
        first, second = run(refused_then_reused(server.address))
    report("connection after an early 413", first=first, second=second)
    assert (first, second) == (413, 200)


async def refused_then_reused(address: tuple[str, int]) -> tuple[int, int]:
    connection = await Connection.open(address)
    try:
        connection.writer.write(
            b"POST /predict HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n" % (64 * 1024) + b" " * (64 * 1024) + b"\r\n"
        for _ in range(MIB // (64 * 1024) + 1):  # just over the limit
            connection.writer.write(chunk)
        first = await asyncio.wait_for(connection.read_reply(time.perf_counter()), HANG_GUARD_S)
        for _ in range(16):  # the client finishes its upload anyway
            connection.writer.write(chunk)
        connection.writer.write(b"0\r\n\r\n")
        second = await asyncio.wait_for(connection.post({"n": 1}), HANG_GUARD_S)
        return first.status, second.status
    except ConnectionResetError:
        return first.status, 0
    finally:
        connection.abort()
