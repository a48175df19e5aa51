"""The connection layer's own refusals (400, 408, 431, 503) tell ``Server-Timing`` as
the app's responses do: the error's name and the time since the request's headers
were awaited (since they came, while its body is read); not when the server tells
none (see ``connection_harness.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from microbatch.serve.http_front import ConnectionLimits

from .connection_harness import LIMITS, harness, settle

TIMED = replace(LIMITS, server_timing=True)


def _timing(data: bytes) -> tuple[str, float]:
    """The error and the total (ms) of a refusal's ``server-timing`` line."""
    head = data.split(b"\r\n\r\n")[0].decode()
    line = next(x for x in head.split("\r\n") if x.lower().startswith("server-timing:"))
    failed, total = line.split(": ", 1)[1].split(", ")
    assert failed.startswith('failed;desc="') and total.startswith("total;dur=")
    return failed[len('failed;desc="') : -1], float(total[len("total;dur=") :])


async def test_slow_headers_tell_request_timeout_and_the_time_waited() -> None:
    async with harness(limits=TIMED) as h:
        connection, transport = h.connect()
        connection.data_received(b"POST /predict HTTP/1.1\r\nhost")
        await h.advance(TIMED.header_timeout_s + 0.1)
        data = bytes(transport.written)
    assert data.startswith(b"HTTP/1.1 408 ")
    error, total_ms = _timing(data)
    assert error == "RequestTimeout"
    assert total_ms == pytest.approx(TIMED.header_timeout_s * 1e3, abs=1.0)  # fired at its due time


@pytest.mark.parametrize(
    ("sent", "status", "error"),
    [
        (b"GET / HTTP/1.1\r\nx: " + b"a" * TIMED.max_header_bytes, b"431", "HeadersTooLarge"),
        (b"NOT HTTP AT ALL\r\n\r\n", b"400", "BadRequest"),
    ],
    ids=["headers over the cap", "malformed"],
)
async def test_a_refused_request_tells_its_error(sent: bytes, status: bytes, error: str) -> None:
    async with harness(limits=TIMED) as h:
        connection, transport = h.connect()
        connection.data_received(sent)
        data = bytes(transport.written)
    assert data.startswith(b"HTTP/1.1 " + status + b" ")
    assert _timing(data)[0] == error


async def test_a_slow_body_tells_the_time_since_its_headers() -> None:
    async with harness(limits=TIMED) as h:
        connection, transport = h.connect()
        await h.advance(1.0)  # the connection idled before its request: not counted
        connection.data_received(b"POST /predict HTTP/1.1\r\ncontent-length: 100\r\n\r\n{")
        await h.advance(TIMED.body_timeout_s + 0.1)
        data = bytes(transport.written)
    assert data.startswith(b"HTTP/1.1 408 ")
    error, total_ms = _timing(data)
    assert error == "RequestTimeout"
    # timed like the request's Server-Timing, from its headers on the real clock: the
    # fake seconds before and after them are not in it
    assert 0.0 <= total_ms < 1000.0


async def test_a_connection_over_the_cap_tells_too_many_connections_at_once() -> None:
    async with harness(limits=replace(TIMED, max_connections=1)) as h:
        transports = [h.connect()[1] for _ in range(2)]
        await settle()
        data = bytes(transports[1].written)
    assert data.startswith(b"HTTP/1.1 503 ")
    assert _timing(data) == ("TooManyConnections", 0.0)


async def test_no_server_timing_when_the_server_tells_none() -> None:
    async with harness(limits=ConnectionLimits(max_connections=1)) as h:
        transports = [h.connect()[1] for _ in range(2)]
        await settle()
        refused = bytes(transports[1].written)
    assert refused.startswith(b"HTTP/1.1 503 ")
    assert b"server-timing" not in refused.lower()
