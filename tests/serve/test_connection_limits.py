"""The HTTP/1.1 connection layer's limits and deadlines, on fake transports and a fake
clock: header, body and keep-alive deadlines, the header cap, early refusals, the
connection cap, a client that leaves (499) and the drain (see ``connection_harness.py``).
"""

from __future__ import annotations

import asyncio

from microbatch.serve.http_front import ConnectionLimits

from .connection_harness import GET_LIVE, LIMITS, harness, post, settle


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
