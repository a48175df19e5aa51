"""The reliability tests' HTTP client: one raw keep-alive HTTP/1.1 connection (a
request at a time, or exactly the bytes a hostile test means), a GET, a Prometheus
metric read from ``/metrics``, and a bounded wait for another process's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

__all__ = ["HANG_GUARD_S", "Connection", "Reply", "eventually", "get", "metric", "sum_samples"]

HANG_GUARD_S = 30.0
"""Longest wait for anything; a guard against hangs, never a pass criterion."""


class Reply(msgspec.Struct, frozen=True):
    """One HTTP response: status, headers (lower-case names), body, seconds taken."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


class Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time.

    Raw rather than httpx: the load generator runs in the test's process, on the same
    two cores as the server, and must cost little; and hostile tests need to send
    exactly the bytes they mean.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, address: tuple[str, int]) -> Connection:
        reader, writer = await asyncio.open_connection(*address, limit=1 << 20)
        return cls(reader, writer)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send one request and read its response (raises ConnectionError if the
        server closes the connection first)."""
        started = time.perf_counter()
        self.send(method, path, body, headers)
        return await self.read_reply(started)

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        head = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", f"content-length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if self.writer.transport.is_closing():
            # The server reset the connection before the request went (a server that
            # exits resets what it had not accepted): uvloop would raise RuntimeError.
            raise ConnectionResetError("the connection closed before the request was sent")
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    async def read_reply(self, started: float) -> Reply:
        try:
            status_line = await self.reader.readuntil(b"\r\n")
            headers: dict[str, str] = {}
            while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            raise ConnectionResetError("the server closed the connection") from error
        return Reply(int(status_line.split()[1]), headers, body, time.perf_counter() - started)

    async def post(
        self, item: object, headers: Mapping[str, str] | None = None, path: str = "/predict"
    ) -> Reply:
        """POST ``item`` as JSON."""
        all_headers = {"content-type": "application/json", **(headers or {})}
        return await self.request("POST", path, msgspec.json.encode(item), all_headers)

    def abort(self) -> None:
        """Drop the connection at once (a client that goes away)."""
        self.writer.transport.abort()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def get(address: tuple[str, int], path: str) -> Reply:
    """One GET on a fresh connection."""
    connection = await Connection.open(address)
    try:
        return await asyncio.wait_for(connection.request("GET", path), HANG_GUARD_S)
    finally:
        await connection.close()


async def metric(address: tuple[str, int], name: str, **labels: str) -> float:
    """The sum of the samples of Prometheus metric ``name`` whose labels include
    ``labels`` (e.g. ``metric(a, "microbatch_http_requests_total", status="503")``)."""
    return sum_samples((await get(address, "/metrics")).body.decode(), name, **labels)


def sum_samples(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` in a Prometheus text page, by labels."""
    total = 0.0
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        metric_name, _, label_text = sample.partition("{")
        if metric_name != name:
            continue
        found = dict(_LABEL.findall(label_text))
        if all(found.get(key) == wanted for key, wanted in labels.items()):
            total += float(value)
    return total


_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def eventually(
    condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = HANG_GUARD_S
) -> float:
    """Poll ``condition`` (it reads another process's state) until true; return
    the seconds it took. Raises AssertionError naming ``what`` past the guard."""
    started = time.monotonic()
    while not await condition():
        assert time.monotonic() - started < timeout_s, f"never happened: {what}"
        await asyncio.sleep(0.01)
    return time.monotonic() - started
