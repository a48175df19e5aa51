"""A lean HTTP/1.1 client for load generation: one keep-alive connection per caller.

Requests are pre-encoded bytes (built once per body by :class:`Endpoint`); a
:class:`Connection` is an ``asyncio.Protocol`` that writes one, parses the reply
with :class:`~microbatch.bench.parser.ResponseParser` and stamps the time the reply
was complete (``time.perf_counter``), inside ``data_received`` — so the time a
busy event loop takes to resume the waiting task is not counted as server latency.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from .parser import ProtocolError, Response, ResponseParser

__all__ = ["Connection", "ConnectionClosed", "Endpoint", "RequestTimeout"]


class ConnectionClosed(Exception):
    """The connection closed (or was reset) before the reply was complete."""


class RequestTimeout(Exception):
    """No complete reply within the request's timeout; the connection was dropped."""


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one request at a time (no pipelining).

    Make one with :meth:`Endpoint.connect`.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._parser = ResponseParser()
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[tuple[Response, float]] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    # -- asyncio.Protocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        """Parse; complete the waiting request with its reply and the time it arrived."""
        try:
            responses = self._parser.feed(data)
        except ProtocolError as error:
            self._fail(error)
            return
        for response in responses:
            waiter = self._waiter
            if waiter is None:
                self._fail(ProtocolError("a response that no request asked for"))
                return
            self._settle()
            if not waiter.done():
                waiter.set_result((response, time.perf_counter()))
            if not response.keep_alive:
                self.close()

    def eof_received(self) -> bool:
        """A reply that runs until the close completes here; anything else failed."""
        try:
            response = self._parser.feed_eof()
        except ProtocolError as error:
            self._fail(error)
            return False
        waiter = self._waiter
        if response is not None and waiter is not None:
            self._settle()
            if not waiter.done():
                waiter.set_result((response, time.perf_counter()))
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail the waiting request, if any."""
        self.closed = True
        self._fail(ConnectionClosed(str(exc) if exc else "the server closed the connection"))

    # -- use -----------------------------------------------------------------------

    def request(self, data: bytes, timeout_s: float) -> asyncio.Future[tuple[Response, float]]:
        """Send one pre-encoded request; the future gives ``(reply, perf_counter at its end)``.

        Raises (through the future):
            ConnectionClosed: The connection closed first.
            RequestTimeout: No reply within ``timeout_s``; the connection is aborted.
            ProtocolError: The reply was malformed; the connection is aborted.
        """
        if self._waiter is not None:
            raise RuntimeError("one request at a time on a connection")
        if self.closed or self._transport is None:
            self.closed = True
            raise ConnectionClosed("the connection is closed")
        waiter = self._waiter = self._loop.create_future()
        self._timer = self._loop.call_later(timeout_s, self._time_out, timeout_s)
        self._transport.write(data)
        return waiter

    def close(self) -> None:
        """Close the connection (a waiting request fails with ConnectionClosed)."""
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _time_out(self, timeout_s: float) -> None:
        self._timer = None
        self._fail(RequestTimeout(f"no reply within {timeout_s:g} s"))

    def _settle(self) -> None:
        self._waiter = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, error: Exception) -> None:
        waiter = self._waiter
        self._settle()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        if not self.closed:
            self.closed = True
            if self._transport is not None:
                self._transport.abort()


@dataclass(frozen=True)
class Endpoint:
    """Where the load goes: a host, a port and the path requests are POSTed to.

    Args:
        host: Host name or address.
        port: TCP port.
        path: Path (and query) of the POSTs, e.g. ``/predict``.
        headers: Extra request headers (e.g. ``Authorization``) sent with every request.
    """

    host: str
    port: int
    path: str = "/predict"
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.path.startswith("/") or any(c.isspace() for c in self.path):
            raise ValueError(f"path must start with / and hold no spaces, got {self.path!r}")
        for name, value in self.headers:
            if not name or any(c in "\r\n:" for c in name) or any(c in "\r\n" for c in value):
                raise ValueError(f"bad header {name!r}: {value!r}")

    @classmethod
    def from_url(cls, url: str, headers: Sequence[tuple[str, str]] = ()) -> Endpoint:
        """Parse ``http://HOST:PORT[/PATH]``; an empty path or ``/`` means ``/predict``.

        Raises:
            ValueError: Not an ``http://`` URL with a host.
        """
        parts = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
        if parts.scheme != "http":
            raise ValueError(f"only plain http:// URLs are supported, got {url!r}")
        if not parts.hostname:
            raise ValueError(f"no host in {url!r}")
        try:
            port = parts.port or 80
        except ValueError as error:
            raise ValueError(f"bad port in {url!r}") from error
        path = parts.path if parts.path not in ("", "/") else "/predict"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.hostname, port, path, tuple(headers))

    @property
    def base(self) -> str:
        """``http://host:port``, for messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def post(self, body: bytes, content_type: str = "application/json") -> bytes:
        """The bytes of one POST of ``body`` to :attr:`path`."""
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self._host_header()}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"{self._extra_headers()}\r\n"
        )
        return head.encode("latin-1") + body

    def get(self, path: str) -> bytes:
        """The bytes of one GET of ``path`` on the same host."""
        head = f"GET {path} HTTP/1.1\r\nHost: {self._host_header()}\r\n{self._extra_headers()}\r\n"
        return head.encode("latin-1")

    async def connect(self) -> Connection:
        """Open a new connection.

        Raises:
            OSError: The connection could not be made.
        """
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(Connection, self.host, self.port)
        return protocol

    async def fetch(self, path: str, timeout_s: float = 30.0) -> Response:
        """GET ``path`` on a connection of its own (for /metrics and /openapi.json).

        Raises:
            OSError, ConnectionClosed, RequestTimeout, ProtocolError: It failed.
        """
        connection = await self.connect()
        try:
            response, _ = await connection.request(self.get(path), timeout_s)
        finally:
            connection.close()
        return response

    def _host_header(self) -> str:
        return self.base.removeprefix("http://")

    def _extra_headers(self) -> str:
        return "".join(f"{name}: {value}\r\n" for name, value in self.headers)
