"""The HTTP/1.1 connection layer against fake transports, on a fake clock.

Every test drives one or more :class:`HttpConnection` objects by hand: bytes in
through ``data_received``, bytes out collected by the fake transport, timers fired by
advancing the :class:`FakeClock`. The app is the real :class:`HttpApp` over a tiny
in-memory servable, so the fast path and the ASGI path are both the real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httptools
import msgspec
import pytest

from microbatch.http.app import HttpApp, HttpConfig
from microbatch.serve.connection import HttpConnection
from microbatch.serve.http_front import ConnectionLimits, Front
from microbatch.stats import ServiceStats
from microbatch.testing import FakeClock

LIMITS = ConnectionLimits(
    header_timeout_s=10.0, body_timeout_s=30.0, keep_alive_s=5.0, max_header_bytes=1024
)


class Point(msgspec.Struct):
    x: float


class Doubled(msgspec.Struct):
    y: float


class Doubler:
    """A servable in memory: ``{"x"}`` -> ``{"y": 2x}``; while ``gate`` is set, every
    item waits for it."""

    name = "double"
    input_type = Point
    output_type = Doubled
    examples = ()
    ready = True

    def __init__(self) -> None:
        self.routes: dict[str, Any] = {}
        self.gate: asyncio.Event | None = None
        self.submitted: list[float] = []
        self.cancelled = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def submit(
        self, item: Point, *, deadline: float | None = None, route: str | None = None
    ) -> Doubled:
        self.submitted.append(item.x)
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return Doubled(2 * item.x)

    def stats(self) -> ServiceStats:
        return ServiceStats(True, False, 0, ())


@dataclass
class FakeTransport:
    """Collects what the server writes; closing reports the loss on the next turn."""

    protocol: HttpConnection | None = None
    written: bytearray = field(default_factory=bytearray)
    closed: bool = False
    reading: bool = True

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after close"
        self.written += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            assert self.protocol is not None
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def responses(self) -> list[Response]:
        """The responses written so far, parsed (100 Continue included)."""
        return parse_responses(bytes(self.written))


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class _ResponseCollector:
    def __init__(self) -> None:
        self.done: list[Response] = []
        self._headers: dict[bytes, bytes] = {}
        self._body = bytearray()
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self._headers, self._body = {}, bytearray()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.done.append(Response(self.parser.get_status_code(), self._headers, bytes(self._body)))


def parse_responses(data: bytes) -> list[Response]:
    """Every whole response in ``data``; fails on anything that is not HTTP/1.1."""
    responses: list[Response] = []
    while data.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
        responses.append(Response(100, {}, b""))
        data = data[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]
    collector = _ResponseCollector()
    rest = data
    while rest:
        # A 100 Continue may sit between responses; the parser would take it for one.
        marker = rest.find(b"HTTP/1.1 100 Continue\r\n\r\n")
        piece, rest = (rest, b"") if marker < 0 else (rest[:marker], rest[marker + 25 :])
        if piece:
            collector.parser.feed_data(piece)
        responses.extend(collector.done)
        collector.done.clear()
        if marker >= 0:
            responses.append(Response(100, {}, b""))
    return responses


class Harness:
    """A front with an app over :class:`Doubler`, a fake clock, and connections."""

    def __init__(self, limits: ConnectionLimits = LIMITS, **config: Any) -> None:
        self.servable = Doubler()
        self.app = HttpApp(self.servable, HttpConfig(**config))  # type: ignore[arg-type]
        self.clock = FakeClock(1000.0)
        self.recorded: list[tuple[str, int]] = []
        self.front = Front(
            self.app,
            limits,
            self.app.native_predictors(),
            lambda route, status, seconds, request_id, client: self.recorded.append(
                (route, status)
            ),
            clock=self.clock,
        )

    def connect(self) -> tuple[HttpConnection, FakeTransport]:
        connection = self.front()
        transport = FakeTransport(connection)
        connection.connection_made(transport)  # type: ignore[arg-type]
        return connection, transport

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await settle()


async def settle(turns: int = 20) -> None:
    """Let the loop run what is ready (the fake servable never waits on time)."""
    for _ in range(turns):
        await asyncio.sleep(0)


def post(x: float, path: str = "/predict", extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    body = b'{"x": %r}' % x
    return (
        b"POST %s HTTP/%s\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n%s" % (path.encode(), version, len(body), extra, body)
    )


GET_LIVE = b"GET /health/live HTTP/1.1\r\nhost: t\r\n\r\n"


@asynccontextmanager
async def harness(**kwargs: Any) -> AsyncIterator[Harness]:
    """A harness; on exit, nothing may be left: no task, no armed timer."""
    made = Harness(**kwargs)
    before = asyncio.all_tasks()
    yield made
    made.front.close_all()
    await settle()
    assert asyncio.all_tasks() - before == set(), "a task outlived its connection"
    assert not made.front.connections
    assert all(timer.cancelled for _, _, timer in made.clock._timers), "a timer left armed"


# -- the basics ---------------------------------------------------------------------


async def test_a_prediction_on_the_fast_path() -> None:
    async with harness() as h:
        _, transport = h.connect()
        h_conn = transport.protocol
        assert h_conn is not None
        h_conn.data_received(post(1.5))
        await settle()
        [response] = transport.responses()
    assert (response.status, msgspec.json.decode(response.body)) == (200, {"y": 3.0})
    assert response.headers[b"content-type"] == b"application/json"
    assert h.recorded == [("/predict", 200)]


async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        h.servable.gate = asyncio.Event()
        connection.data_received(post(1.0) + GET_LIVE + post(2.0))
        await settle()
        assert transport.responses() == [] and h.servable.submitted == [1.0]
        assert not transport.reading  # the rest waits, unparsed, with reading paused
        h.servable.gate.set()
        await settle()
        statuses = [r.status for r in transport.responses()]
    assert statuses == [200, 200, 200]
    assert h.servable.submitted == [1.0, 2.0]


async def test_every_split_of_a_request_gives_the_same_single_response() -> None:
    request = post(4.0)
    async with harness() as h:
        for cut in range(1, len(request)):
            connection, transport = h.connect()
            connection.data_received(request[:cut])
            connection.data_received(request[cut:])
            await settle()
            assert [r.status for r in transport.responses()] == [200], cut
            transport.close()
            await settle()


async def test_a_blank_line_split_across_reads_ends_the_headers() -> None:
    """The split "\\r\\n\\r" + "\\n" must not make body bytes count as headers."""
    limits = ConnectionLimits(max_header_bytes=80)
    body = b'{"x": 1.0}' + b" " * 500  # far more body than the header cap
    head = b"POST /predict HTTP/1.1\r\ncontent-length: %d\r\n\r" % len(body)
    assert len(head) < 80
    async with harness(limits=limits) as h:
        connection, transport = h.connect()
        connection.data_received(head)
        connection.data_received(b"\n" + body)
        await settle()
        [response] = transport.responses()
    assert response.status == 200


async def test_head_is_answered_like_get_without_a_body() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(b"HEAD /health/live HTTP/1.1\r\nhost: t\r\n\r\n" + GET_LIVE)
        await settle()
        data = bytes(transport.written)
    head_reply, _, rest = data.partition(b"\r\n\r\n")
    assert head_reply.startswith(b"HTTP/1.1 200 ")
    assert b"content-length: 17" in head_reply
    assert rest.startswith(b"HTTP/1.1 200 ")  # no body between the two responses
    assert rest.endswith(b'{"status":"live"}')


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        request = post(2.0, extra=b"expect: 100-continue\r\n")
        head, _, body = request.partition(b"\r\n\r\n")
        connection.data_received(head + b"\r\n\r\n")
        await settle()
        assert bytes(transport.written) == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.data_received(body)
        await settle()
        statuses = [r.status for r in transport.responses()]
    assert statuses == [100, 200]


async def test_expect_100_continue_with_a_body_too_large_gets_413_alone() -> None:
    async with harness(max_body_bytes=100) as h:
        connection, transport = h.connect()
        connection.data_received(
            b"POST /predict HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 5000\r\n\r\n"
        )
        await settle()
        [response] = transport.responses()
    assert response.status == 413  # and no 100 Continue: the client need not send it


async def test_chunked_bodies_are_decoded_and_a_pipelined_request_follows() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(
            b"POST /predict HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
            b'4;ext=1\r\n{"x"\r\n6\r\n: 2.5}\r\n0\r\nx-trailer: 1\r\n\r\n' + GET_LIVE
        )
        await settle()
        responses = transport.responses()
        closed = transport.closed
    assert [(r.status, r.body) for r in responses] == [
        (200, b'{"y":5.0}'),
        (200, b'{"status":"live"}'),
    ]
    assert not closed


async def test_a_chunked_body_over_the_limit_gets_413_and_the_connection_goes_on() -> None:
    chunk = b"%x\r\n%s\r\n" % (60, b" " * 60)
    async with harness(max_body_bytes=100) as h:
        connection, transport = h.connect()
        connection.data_received(
            b"POST /predict HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n" + chunk * 2
        )
        await settle()
        connection.data_received(chunk * 5 + b"0\r\n\r\n" + post(1.0))
        await settle()
        statuses = [r.status for r in transport.responses()]
    assert statuses == [413, 200]


@pytest.mark.parametrize(
    ("request_line", "extra", "closes", "connection_header"),
    [
        (b"HTTP/1.1", b"connection: close\r\n", True, b"close"),
        (b"HTTP/1.0", b"", True, b"close"),
        (b"HTTP/1.0", b"connection: keep-alive\r\n", False, b"keep-alive"),
        (b"HTTP/1.1", b"", False, None),
    ],
)
async def test_connection_close_and_http_1_0(
    request_line: bytes, extra: bytes, closes: bool, connection_header: bytes | None
) -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(
            b"GET /health/live %s\r\nhost: t\r\n%s\r\n" % (request_line, extra)
        )
        await settle()
        [response] = transport.responses()
        closed = transport.closed
    assert response.status == 200
    assert response.headers.get(b"connection") == connection_header
    assert closed is closes


async def test_garbage_gets_400_and_close() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(b"\x00\x01 not http at all\r\n\r\n")
        await settle()
        data, closed = bytes(transport.written), transport.closed
    assert data.startswith(b"HTTP/1.1 400 ")
    assert closed


async def test_the_asgi_path_serves_other_routes_and_errors() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(
            b"GET /nothing HTTP/1.1\r\n\r\n"
            b"GET /predict HTTP/1.1\r\n\r\n"
            b"GET /openapi.json?x=1 HTTP/1.1\r\n\r\n"
        )
        await settle()
        statuses = [r.status for r in transport.responses()]
    assert statuses == [404, 405, 200]


async def test_fast_path_errors_are_the_apps() -> None:
    async with harness(auth_token="secret") as h:
        connection, transport = h.connect()
        connection.data_received(
            post(1.0)
            + post(1.0, extra=b"authorization: Bearer secret\r\n")
            + b"POST /predict HTTP/1.1\r\nauthorization: Bearer secret\r\n"
            b'content-length: 9\r\n\r\n{"x": []}'
            + b"POST /predict HTTP/1.1\r\nauthorization: Bearer secret\r\n"
            b"content-type: text/plain\r\ncontent-length: 1\r\n\r\nx"
        )
        await settle()
        statuses = [r.status for r in transport.responses()]
    assert statuses == [401, 200, 422, 415]


# -- limits and deadlines -------------------------------------------------------------


async def test_slow_headers_get_408_at_the_header_deadline() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(b"POST /predict HTTP/1.1\r\nhost")
        await h.advance(LIMITS.header_timeout_s - 0.1)
        assert transport.written == b""
        await h.advance(0.2)
        data, closed = bytes(transport.written), transport.closed
    assert data.startswith(b"HTTP/1.1 408 ")
    assert closed


async def test_an_idle_kept_alive_connection_closes_quietly_after_keep_alive() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(GET_LIVE)
        await settle()
        answered = len(transport.written)
        await h.advance(LIMITS.keep_alive_s + 0.1)
        data, closed = bytes(transport.written), transport.closed
    assert closed
    assert len(data) == answered  # nothing more was sent


async def test_each_kept_alive_request_gets_a_fresh_header_deadline() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        for _ in range(5):
            await h.advance(LIMITS.keep_alive_s * 0.8)
            connection.data_received(GET_LIVE)
            await settle()
        statuses = [r.status for r in transport.responses()]
        closed = transport.closed
    assert statuses == [200] * 5
    assert not closed


async def test_a_pipelined_request_with_headers_over_the_cap_gets_431() -> None:
    huge = b"GET /health/live HTTP/1.1\r\nx-filler: " + b"y" * 5000 + b"\r\n\r\n"
    async with harness() as h:
        connection, transport = h.connect()
        h.servable.gate = asyncio.Event()
        connection.data_received(post(1.0) + huge)
        await settle()
        h.servable.gate.set()
        await settle()
        data, closed = bytes(transport.written), transport.closed
    first, _, second = data.partition(b'{"y":2.0}')
    assert first.startswith(b"HTTP/1.1 200 ")
    assert second.startswith(b"HTTP/1.1 431 ")
    assert closed


async def test_pipelined_slow_headers_get_408_from_the_previous_response() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        h.servable.gate = asyncio.Event()
        connection.data_received(post(1.0) + b"GET /health/live HTTP/1.1\r\nho")
        await h.advance(LIMITS.header_timeout_s * 2)  # the model is slow: no read deadline
        h.servable.gate.set()
        await settle()
        assert [r.status for r in transport.responses()] == [200]
        await h.advance(LIMITS.header_timeout_s + 0.1)
        data, closed = bytes(transport.written), transport.closed
    assert data.split(b"\r\n\r\n")[-2].startswith(b"HTTP/1.1 408 ") or b"HTTP/1.1 408 " in data
    assert closed


async def test_a_slow_body_gets_408_at_the_body_deadline() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(b"POST /predict HTTP/1.1\r\ncontent-length: 100\r\n\r\n{")
        await h.advance(LIMITS.body_timeout_s + 0.1)
        data, closed = bytes(transport.written), transport.closed
    assert data.startswith(b"HTTP/1.1 408 ")
    assert closed


async def test_after_an_early_413_a_trickled_body_still_has_its_deadline() -> None:
    async with harness(max_body_bytes=100) as h:
        connection, transport = h.connect()
        connection.data_received(b"POST /predict HTTP/1.1\r\ncontent-length: 100000\r\n\r\n")
        await settle()
        assert transport.responses()[0].status == 413
        for _ in range(5):
            await h.advance(LIMITS.body_timeout_s / 10)
            connection.data_received(b"x" * 10)  # slowloris on the body
        assert not transport.closed
        await h.advance(LIMITS.body_timeout_s)
        closed = transport.closed
    assert closed


async def test_a_small_body_refused_early_keeps_the_connection() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        connection.data_received(
            b"POST /predict HTTP/1.1\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\n"
        )
        await settle()
        connection.data_received(b"hello" + GET_LIVE)
        await settle()
        statuses = [r.status for r in transport.responses()]
    assert statuses == [415, 200]


async def test_connections_over_the_cap_get_503() -> None:
    async with harness(limits=ConnectionLimits(max_connections=2)) as h:
        transports = [h.connect()[1] for _ in range(3)]
        await settle()
        third = bytes(transports[2].written)
        open_ones = [t.closed for t in transports]
    assert third.startswith(b"HTTP/1.1 503 ")
    assert open_ones == [False, False, True]


async def test_a_client_that_leaves_cancels_its_item_and_is_recorded_499() -> None:
    async with harness() as h:
        connection, transport = h.connect()
        h.servable.gate = asyncio.Event()
        connection.data_received(post(3.0))
        await settle()
        transport.close()
        await settle()
    assert h.servable.cancelled == 1
    assert h.recorded == [("/predict", 499)]


async def test_draining_closes_idle_connections_and_busy_ones_after_their_response() -> None:
    async with harness() as h:
        _, idle = h.connect()
        busy_connection, busy = h.connect()
        h.servable.gate = asyncio.Event()
        busy_connection.data_received(post(1.0))
        await settle()
        h.front.shut_down()
        await settle()
        assert idle.closed and not busy.closed
        h.servable.gate.set()
        await settle()
        [response] = busy.responses()
        closed = busy.closed
    assert response.status == 200 and response.headers[b"connection"] == b"close"
    assert closed
