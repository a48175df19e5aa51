"""A slow HTTP client over a real TCP socket, in one process and under
``serve --workers 2``: a client that stops reading an endless stream (its receive
buffer kept small) gets, once it reads again, the chunks that were buffered and
then the final ``SlowReader`` error; meanwhile its item left the step loop, so the
next stream runs (the service steps one item at a time, so that stream can only
run once the slow one has left). Bounded: every read has a timeout.

The service bounds its streams at 64 unread chunks (``Stage(max_buffered_chunks=64)``),
and each of its chunks is 16 KiB, so the socket buffers fill in a few hundred steps."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from tests.serve.test_server import HANG_GUARD_S, running

from .models import WIDE


def _open_unread_stream(url: str) -> socket.socket:
    """POST an endless NDJSON stream and read nothing but its first bytes."""
    parts = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
    sock.settimeout(HANG_GUARD_S)
    sock.connect((parts.hostname, parts.port))
    body = b'"wide"'
    sock.sendall(
        b"POST /stream HTTP/1.1\r\nHost: x\r\nAccept: application/x-ndjson\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert sock.recv(64).startswith(b"HTTP/1.1 200")
    return sock


def _read_to_the_end(sock: socket.socket) -> list[dict[str, object]]:
    """Read the rest of the response (chunked NDJSON) until its final message."""
    data = bytearray()
    while not data.endswith(b"\r\n0\r\n\r\n"):  # the last chunk of the body
        more = sock.recv(1 << 16)
        assert more, "the server closed the connection before the stream's end"
        data += more
    lines = [line for line in bytes(data).split(b"\n") if line.startswith(b"{")]
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    "workers",
    [[], ["--workers", "2"]],
    ids=["one process", "--workers 2"],
)
def test_a_client_that_stops_reading_is_ended_with_slow_reader(workers: list[str]) -> None:
    with running("tests.streams.served:bounded", *workers, "--log-level", "warning") as server:
        slow = _open_unread_stream(server.url)
        try:
            with httpx.Client(base_url=server.url, timeout=HANG_GUARD_S) as client:
                reply = client.post(
                    "/stream", json="b:2", headers={"accept": "application/x-ndjson"}
                )
            assert [json.loads(line) for line in reply.text.splitlines()] == [
                {"chunk": "b-0"},
                {"chunk": "b-1"},
                {"end": {"status": "complete", "chunks": 2}},
            ]
            messages = _read_to_the_end(slow)
        finally:
            slow.close()
    *chunks, last = messages
    assert len(chunks) >= 64 and all(m.get("chunk") == WIDE for m in chunks)
    assert last["error"] == {
        "error": "SlowReader",
        "message": last["error"]["message"],  # type: ignore[index]
        "status": 408,
    }
    assert "64 chunks waited unread" in str(last["error"])
