"""The HTTP/1.1 connection layer, on fake transports and a fake clock: parsing,
pipelining, HEAD, ``Expect: 100-continue``, chunked bodies, ``Connection: close`` and
HTTP/1.0, and the ASGI path for other routes (see ``connection_harness.py``).
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from microbatch.serve.http_front import ConnectionLimits

from .connection_harness import GET_LIVE, harness, post, settle


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
