"""The streaming benchmark's load-generating HTTP client: closed-loop clients that
POST streams over raw HTTP/1.1 and count chunks as the bytes arrive (a bare
``asyncio.Protocol``: no reader, no future per read), each on a new connection
per stream or on one kept alive and reused; the event loops it can run on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import uvloop

from stream_contenders import HttpContender
from stream_report import summarise


async def http_stream(
    address: tuple[str, int], contender: HttpContender, length: int, client: StreamClient
) -> tuple[float, float, int]:
    """POST one stream of ``length`` chunks on ``client``'s connection; (first chunk
    s, total s, chunks). Each chunk carries one ``@`` whatever the framing (SSE,
    NDJSON, plain lines), counted as the bytes arrive by a bare protocol (no reader,
    no future per read: the client's own CPU time weighs on what it measures, on a
    shared machine)."""
    path, body = contender.path, contender.body(length)
    opened = time.perf_counter()
    counter = await client.connection(address)
    response = counter.expect()
    counter.transport.write(
        f"POST {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n"
        f"Content-Type: application/json\r\nAccept: application/x-ndjson\r\n"
        f"Content-Length: {len(body)}\r\n{client.connection_header}\r\n".encode()
        + body
    )
    try:
        await response
    finally:
        client.done(counter)
    if not counter.head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{path}: {counter.head.splitlines()[:1]!r}")
    if counter.chunks != length or counter.first is None:
        raise RuntimeError(f"{path}: {counter.chunks} chunks for a stream of {length}")
    return counter.first - opened, time.perf_counter() - opened, counter.chunks


class StreamClient:
    """One client's connection: a new one per stream (``Connection: close``, the
    default), or, with ``keep_alive``, one kept open and reused for the client's
    next stream (as a pooled client like httpx or openai's does)."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.connection_header = "" if keep_alive else "Connection: close\r\n"
        self._kept: ChunkCounter | None = None

    async def connection(self, address: tuple[str, int]) -> ChunkCounter:
        """The kept connection if it is still open, else a new one."""
        kept, self._kept = self._kept, None
        if kept is not None and not kept.lost:
            return kept
        loop = asyncio.get_running_loop()
        _, counter = await loop.create_connection(lambda: ChunkCounter(self.keep_alive), *address)
        return counter

    def done(self, counter: ChunkCounter) -> None:
        """The response is over: keep its connection for the next one, or close it."""
        if self.keep_alive and not counter.lost:
            self._kept = counter
        else:
            counter.transport.close()

    def close(self) -> None:
        """Close the kept connection."""
        if self._kept is not None:
            self._kept.transport.close()
            self._kept = None


_LAST_CHUNK = b"\r\n0\r\n\r\n"
"""How a chunked body ends (the CRLF before it ends the last data chunk, or the head)."""


class ChunkCounter(asyncio.Protocol):
    """Responses read to their end (the server closes, or with ``keep_alive`` the
    chunked body's last chunk): each one's head, then ``@``s counted, and when the
    first came."""

    def __init__(self, keep_alive: bool = False) -> None:
        self.keep_alive = keep_alive
        self.transport: asyncio.Transport
        self.lost = False
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def expect(self) -> asyncio.Future[None]:
        """Start counting the next response; done when it ended."""
        self.head = b""
        self._in_head = True
        self._tail = b""
        self.chunks = 0
        self.first: float | None = None
        self.ended = asyncio.get_running_loop().create_future()
        return self.ended

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self._in_head = False
            data, self.head = self.head[end + 4 :], self.head[: end + 4]
            if self.keep_alive and b"transfer-encoding: chunked" not in self.head.lower():
                self.ended.set_exception(RuntimeError("keep-alive needs a chunked response"))
                self.transport.close()
                return
            self._tail = b"\r\n"
        found = data.count(b"@")
        if found and self.first is None:
            self.first = time.perf_counter()
        self.chunks += found
        if self.keep_alive:
            self._tail = (self._tail + data)[-len(_LAST_CHUNK) :]
            if self._tail == _LAST_CHUNK and not self.ended.done():
                self.ended.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.ended.done():
            self.ended.set_result(None)


async def http_run(
    address: tuple[str, int],
    contender: HttpContender,
    concurrency: int,
    work: list[int],
    keep_alive: bool = False,
) -> dict[str, Any]:
    """Stream every length in ``work`` with ``concurrency`` clients, each on a new
    connection per stream or (``keep_alive``) on one connection it reuses."""
    records: list[tuple[int, float, float, bool]] = []
    queue = list(reversed(work))

    async def client() -> None:
        own = StreamClient(keep_alive)
        at_start = True  # every client's first stream opens at once
        try:
            while queue:
                length = queue.pop()
                first, total, _ = await http_stream(address, contender, length, own)
                records.append((length, first, total, at_start))
                at_start = False
        finally:
            own.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return summarise(records, time.perf_counter() - started)


CLIENT_LOOPS: dict[str, Callable[[Any], Any]] = {"uvloop": uvloop.run, "asyncio": asyncio.run}
"""The event loops the HTTP client can run on: uvloop by default (the same for every
contender), so that the client's own CPU time weighs less on what it measures."""
