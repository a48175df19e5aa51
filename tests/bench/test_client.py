"""The keep-alive client and both load loops, against a scripted asyncio server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from microbatch.bench import (
    ConnectionClosed,
    Endpoint,
    ProtocolError,
    RequestTimeout,
    Tally,
    closed_loop,
    open_loop,
)
from microbatch.bench.runner import run_in_event_loop

Reply = Callable[[bytes], Awaitable[bytes | None]]
"""Request body -> raw reply bytes (None: stay silent)."""


def ok(body: bytes, status: int = 200, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


class FakeServer:
    """Reads HTTP/1.1 requests with Content-Length and answers what ``reply`` says."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests = 0
        self.handlers: list[tuple[asyncio.Task[None], asyncio.StreamWriter]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.append((task, writer))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests += 1
                answer = await self.reply(body)
                if answer is None:
                    await reader.read()  # silent until the client gives up
                    return
                writer.write(answer)
                await writer.drain()
                if b"connection: close" in answer.lower():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(reply: Reply) -> AsyncIterator[tuple[FakeServer, Endpoint]]:
    fake = FakeServer(reply)
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield fake, Endpoint("127.0.0.1", port)
    finally:
        server.close()
        for _, writer in fake.handlers:
            writer.close()  # each handler then sees the end of its stream and returns
        await asyncio.gather(*(task for task, _ in fake.handlers))
        await server.wait_closed()


async def echo(body: bytes) -> bytes:
    return ok(body)


async def test_one_connection_carries_many_requests_and_each_gets_its_own_reply() -> None:
    async with serving(echo) as (fake, endpoint):
        connection = await endpoint.connect()
        for i in range(20):
            response, _ = await connection.request(endpoint.post(b'{"i": %d}' % i), 5.0)
            assert response.body == b'{"i": %d}' % i
        connection.close()
    assert fake.connections == 1
    assert fake.requests == 20


async def test_connection_close_in_a_reply_closes_the_connection() -> None:
    async def closing(body: bytes) -> bytes:
        return ok(b"bye", extra="connection: close\r\n")

    async with serving(closing) as (_, endpoint):
        connection = await endpoint.connect()
        response, _ = await connection.request(endpoint.post(b"{}"), 5.0)
        assert (response.body, response.keep_alive, connection.closed) == (b"bye", False, True)
        with pytest.raises(ConnectionClosed):
            connection.request(endpoint.post(b"{}"), 5.0)


async def test_a_reply_that_never_comes_times_out() -> None:
    async def silent(body: bytes) -> None:
        return None

    async with serving(silent) as (_, endpoint):
        connection = await endpoint.connect()
        with pytest.raises(RequestTimeout):
            await connection.request(endpoint.post(b"{}"), 0.05)
        assert connection.closed


async def test_a_body_cut_short_by_the_server_is_a_protocol_error() -> None:
    async def short(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\nonly this"

    async with serving(short) as (_, endpoint):
        connection = await endpoint.connect()
        with pytest.raises(ProtocolError):
            await connection.request(endpoint.post(b"{}"), 5.0)


async def test_fetch_gets_a_path_on_a_connection_of_its_own() -> None:
    seen: list[bytes] = []

    async def record(body: bytes) -> bytes:
        seen.append(body)
        return ok(b"# metrics\n")

    async with serving(record) as (fake, endpoint):
        response = await endpoint.fetch("/metrics")
    assert (response.status, response.body, seen, fake.connections) == (
        200,
        b"# metrics\n",
        [b""],
        1,
    )


def test_endpoints_come_from_urls_and_refuse_what_they_cannot_send() -> None:
    assert Endpoint.from_url("http://127.0.0.1:8000") == Endpoint("127.0.0.1", 8000, "/predict")
    assert Endpoint.from_url("localhost:9/v1/embed?x=1").path == "/v1/embed?x=1"
    endpoint = Endpoint.from_url("http://[::1]:80/", [("Authorization", "Bearer t")])
    assert endpoint.base == "http://[::1]:80"
    request = endpoint.post(b"{}")
    assert request.startswith(b"POST /predict HTTP/1.1\r\nHost: [::1]:80\r\n")
    assert b"Authorization: Bearer t\r\n" in request
    assert request.endswith(b"Content-Length: 2\r\nAuthorization: Bearer t\r\n\r\n{}")
    for bad in ("https://example.com", "http://:80", "http://h:99999"):
        with pytest.raises(ValueError):
            Endpoint.from_url(bad)
    with pytest.raises(ValueError):
        Endpoint("h", 1, headers=(("X", "a\r\nInjected: 1"),))


async def test_a_closed_loop_counts_every_reply_by_status() -> None:
    async def by_body(body: bytes) -> bytes:
        return ok(b"{}", status=200 if body == b"good" else 422)

    async with serving(by_body) as (fake, endpoint):
        tally = Tally()
        requests = [endpoint.post(b"good"), endpoint.post(b"good"), endpoint.post(b"bad")]
        elapsed = await closed_loop(
            endpoint, requests, concurrency=4, duration_s=0.2, timeout_s=5.0, tally=tally
        )
    assert elapsed > 0
    assert tally.requests == fake.requests == len(tally.latencies_s)
    assert set(tally.statuses) == {200, 422}
    assert tally.statuses[200] + tally.statuses[422] == tally.requests
    assert fake.connections == 4


async def test_a_closed_loop_counts_a_refused_connection() -> None:
    async with serving(echo) as (_, endpoint):
        pass  # closed again: nothing listens on that port now
    tally = Tally()
    await closed_loop(
        endpoint, [endpoint.post(b"{}")], concurrency=2, duration_s=0.1, timeout_s=1.0, tally=tally
    )
    assert tally.failures["connect"] >= 2
    assert tally.requests == tally.failures["connect"]


async def test_an_open_loop_sends_or_counts_every_arrival_and_times_from_when_it_was_due() -> None:
    delay_s, rate, duration_s = 0.05, 1000.0, 0.2

    async def slow(body: bytes) -> bytes:
        await asyncio.sleep(delay_s)
        return ok(b"{}")

    gaps = random.Random(0)
    arrivals = list(
        itertools.takewhile(
            lambda t: t < duration_s,
            itertools.accumulate(gaps.expovariate(rate) for _ in range(10_000)),
        )
    )
    # The second arrival is due well before the first reply can come back.
    assert arrivals[1] - arrivals[0] < 0.5 * delay_s
    async with serving(slow) as (_, endpoint):
        tally = Tally()
        await open_loop(
            endpoint,
            [endpoint.post(b"{}")],
            rate=rate,
            duration_s=duration_s,
            timeout_s=5.0,
            max_outstanding=1,
            tally=tally,
            rng=random.Random(0),
        )
    assert tally.requests + tally.unsent == len(arrivals)
    assert tally.unsent > 0
    assert tally.statuses[200] == tally.requests
    assert min(tally.latencies_s) >= delay_s
    # It waited for the first reply before it could be sent, and that wait counts.
    assert tally.latencies_s[1] >= 2 * delay_s - (arrivals[1] - arrivals[0])


def test_the_command_runs_the_client_on_uvloop() -> None:
    # uvloop is a core dependency (the server runs on it)
    async def load() -> tuple[Tally, str]:
        async with serving(echo) as (_, endpoint):
            tally = Tally()
            await closed_loop(
                endpoint,
                [endpoint.post(b"{}")],
                concurrency=2,
                duration_s=0.1,
                timeout_s=5.0,
                tally=tally,
            )
        return tally, type(asyncio.get_running_loop()).__module__

    tally, loop_module = run_in_event_loop(load())
    assert loop_module.startswith("uvloop")
    assert tally.requests > 0
    assert tally.statuses[200] == tally.requests
