"""A harness for the HTTP/1.1 connection layer: fake transports, a fake clock.

A test drives one or more :class:`HttpConnection` objects by hand: bytes in through
``data_received``, bytes out collected by :class:`FakeTransport`, timers fired by
advancing the :class:`FakeClock`. The app is the real :class:`HttpApp` over a tiny
in-memory servable (:class:`Doubler`), so the fast path and the ASGI path are both
the real ones. Used by ``test_connection*.py`` and ``test_settings.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httptools
import msgspec

from microbatch.http.app import HttpApp, HttpConfig
from microbatch.serve.connection import HttpConnection
from microbatch.serve.http_front import ConnectionLimits, Front
from microbatch.stats import ServiceStats
from microbatch.streams import Channel, Stream
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


class StreamingDoubler(Doubler):
    """:class:`Doubler` that also streams: ``{"x"}`` -> the chunks ``x`` and ``2x``,
    pushed on the loop's next turns, then the end (through the real
    :class:`~microbatch.streams.Stream`, so the direct writes are the real ones)."""

    def can_stream(self, route: str | None = None) -> bool:
        return route is None

    def stream(
        self,
        item: Point,
        *,
        deadline: float | None = None,
        route: str | None = None,
        first_chunk_deadline: float | None = None,
    ) -> AsyncIterator[Any]:
        channel = Channel(0, item, deadline=None, first_chunk_deadline=None, clock=FakeClock())
        loop = asyncio.get_running_loop()
        loop.call_soon(channel.push, item.x)
        loop.call_soon(channel.push, 2 * item.x)
        loop.call_soon(channel.finish)
        return Stream(channel)


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
    """A front with an app over :class:`Doubler` (or ``servable``), a fake clock,
    and connections."""

    def __init__(
        self, limits: ConnectionLimits = LIMITS, servable: Any = None, **config: Any
    ) -> None:
        self.clock = FakeClock(1000.0)
        self.servable: Any = Doubler() if servable is None else servable
        self.app = HttpApp(self.servable, HttpConfig(**config))
        self.recorded: list[tuple[str, int]] = []
        self.front = Front(
            self.app,
            limits,
            self.app.native_predictors(),
            lambda route, status, seconds, request_id, client: self.recorded.append(
                (route, status)
            ),
            clock=self.clock,
            streams=self.app.native_streams(),
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
