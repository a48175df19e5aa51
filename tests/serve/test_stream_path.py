"""Streams on ``microbatch serve``'s own connection layer, without ASGI, on fake
transports: the head with the first chunk, chunked framing (to the close on
HTTP/1.0), the next request after the stream, a client that leaves, a slow reader,
``Server-Timing``, and every error before the first chunk as a plain response."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from microbatch import ItemError
from microbatch.errors import Overloaded
from microbatch.streams import Channel, Stream
from microbatch.testing import FakeClock

from .connection_harness import (
    GET_LIVE,
    FakeTransport,
    Harness,
    Point,
    StreamingDoubler,
    harness,
    parse_responses,
    post,
    settle,
)

NDJSON = b"accept: application/x-ndjson\r\n"


class Teller(StreamingDoubler):
    """A streaming servable in memory: each stream's channel is kept for the test to
    push chunks into and end; ``refuse`` is raised instead of opening one."""

    def __init__(self) -> None:
        super().__init__()
        self.channels: list[Channel] = []
        self.refuse: Exception | None = None
        self._clock = FakeClock()

    def stream(
        self,
        item: Point,
        *,
        deadline: float | None = None,
        route: str | None = None,
        first_chunk_deadline: float | None = None,
    ) -> AsyncIterator[Any]:
        if self.refuse is not None:
            raise self.refuse
        channel = Channel(
            len(self.channels), item, deadline=None, first_chunk_deadline=None, clock=self._clock
        )
        self.channels.append(channel)
        return Stream(channel)


def teller_harness(**config: Any) -> Any:
    return harness(servable=Teller(), **config)


def ndjson(body: bytes) -> list[Any]:
    return [json.loads(line) for line in body.splitlines()]


async def open_stream(
    made: Harness, extra: bytes = NDJSON, path: str = "/stream", version: bytes = b"1.1"
) -> tuple[Any, FakeTransport, Channel]:
    connection, transport = made.connect()
    connection.data_received(post(1.5, path, extra, version))
    await settle()
    channel: Channel = made.servable.channels[-1]
    assert channel.item == Point(1.5)
    return connection, transport, channel


async def test_a_stream_goes_out_chunked_without_asgi_then_the_next_request() -> None:
    async with teller_harness() as made:
        connection, transport, channel = await open_stream(made)
        connection.data_received(GET_LIVE)  # pipelined: waits for the stream's end
        assert transport.written == b""  # the head waits for the first chunk
        channel.push("a")
        await settle()
        head = bytes(transport.written)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked\r\n" in head
        assert b"content-type: application/x-ndjson\r\n" in head
        assert b"x-request-id: " in head
        assert connection._cycle is None  # not through the ASGI app
        channel.push("b")
        channel.push("c")  # one step's chunks: written from one callback, in order
        await settle()
        channel.finish()
        await settle()
        stream, live = transport.responses()
        assert stream.status == 200
        assert ndjson(stream.body) == [
            {"chunk": "a"},
            {"chunk": "b"},
            {"chunk": "c"},
            {"end": {"status": "complete", "chunks": 3}},
        ]
        assert live.status == 200
        assert not transport.closed
        assert made.recorded == [("/stream", 200)]


async def test_a_stream_without_chunks_is_its_head_and_end() -> None:
    async with teller_harness() as made:
        _, transport, channel = await open_stream(made)
        channel.finish()
        await settle()
        (stream,) = transport.responses()
        assert ndjson(stream.body) == [{"end": {"status": "complete", "chunks": 0}}]


async def test_on_http_1_0_the_stream_runs_to_the_close() -> None:
    async with teller_harness() as made:
        _, transport, channel = await open_stream(made, version=b"1.0")
        channel.push("a")
        channel.finish()
        await settle()
        head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head and b"content-length" not in head
        assert b"connection: close\r\n" in head + b"\r\n"
        assert ndjson(body) == [{"chunk": "a"}, {"end": {"status": "complete", "chunks": 1}}]
        assert transport.closed


async def test_an_error_after_the_first_chunk_is_the_final_message() -> None:
    async with teller_harness() as made:
        _, transport, channel = await open_stream(made)
        channel.push("a")
        await settle()
        channel.finish(ItemError("it broke"))
        await settle()
        (stream,) = transport.responses()
        assert stream.status == 200
        assert ndjson(stream.body)[-1] == {
            "error": {"error": "ItemError", "message": "it broke", "status": 422}
        }


async def test_a_client_that_leaves_mid_stream_leaves_the_stream() -> None:
    async with teller_harness() as made:
        _, transport, channel = await open_stream(made)
        channel.push("a")
        await settle()
        transport.close()  # the client is gone
        await settle()
        assert channel.left
        channel.push("b")  # the next step's chunk goes nowhere
        await settle()
        assert made.recorded == [("/stream", 499)]


async def test_a_slow_reader_gets_every_chunk_once_in_order() -> None:
    async with teller_harness() as made:
        connection, transport, channel = await open_stream(made)
        channel.push(0)
        await settle()
        connection.pause_writing()  # the client reads slowly: the writer task waits
        for position in range(1, 6):
            channel.push(position)
            await settle()
        connection.resume_writing()
        await settle()
        channel.push(6)
        channel.finish()
        await settle()
        (stream,) = transport.responses()
        messages = ndjson(stream.body)
        assert messages[:-1] == [{"chunk": k} for k in range(7)]
        assert messages[-1] == {"end": {"status": "complete", "chunks": 7}}


async def test_predict_streams_only_when_accept_asks() -> None:
    async with teller_harness() as made:
        connection, transport = made.connect()
        connection.data_received(post(2.0, "/predict", b"accept: text/event-stream\r\n"))
        await settle()
        channel = made.servable.channels[-1]
        channel.push("x")
        channel.finish()
        await settle()
        connection.data_received(post(2.0, "/predict"))
        await settle()
        stream, whole = transport.responses()
        assert stream.headers[b"content-type"] == b"text/event-stream"
        assert stream.body.startswith(b'event: chunk\ndata: "x"\n\n')
        assert json.loads(whole.body) == {"y": 4.0}
        assert made.recorded == [("/predict", 200), ("/predict", 200)]


async def test_the_head_tells_the_wait_for_the_first_chunk() -> None:
    async with teller_harness(server_timing=True) as made:
        _, transport, channel = await open_stream(made)
        channel.push("a")
        channel.finish()
        await settle()
        (stream,) = transport.responses()
        assert stream.headers[b"server-timing"].startswith(b"first;dur=")


@pytest.mark.parametrize(
    ("extra", "body", "refuse", "status"),
    [
        (b"accept: text/html\r\n", None, None, 406),
        (NDJSON + b"x-first-chunk-timeout-ms: soon\r\n", None, None, 400),
        (NDJSON + b"x-request-timeout-ms: -1\r\n", None, None, 400),
        (NDJSON, b"{not json", None, 400),
        (NDJSON, b'{"x": "one"}', None, 422),
        (NDJSON, None, Overloaded("too many items inside"), 503),
    ],
)
async def test_an_error_before_the_stream_is_a_plain_response(
    extra: bytes, body: bytes | None, refuse: Exception | None, status: int
) -> None:
    async with teller_harness() as made:
        made.servable.refuse = refuse
        connection, transport = made.connect()
        request = post(1.0, "/stream", extra)
        if body is not None:
            head = request.partition(b"\r\n\r\n")[0].rsplit(b"content-length", 1)[0]
            request = head + b"content-length: %d\r\n\r\n%s" % (len(body), body)
        connection.data_received(request + GET_LIVE)
        await settle()
        error, live = transport.responses()
        assert error.status == status
        assert b"x-request-id" in error.headers
        assert json.loads(error.body)["request_id"] == error.headers[b"x-request-id"].decode()
        assert live.status == 200  # the connection goes on
        assert made.recorded[0] == ("/stream", status)
        assert made.servable.channels == []


async def test_the_body_limit_holds_for_a_stream() -> None:
    async with teller_harness(max_body_bytes=64) as made:
        connection, transport = made.connect()
        body = b'{"x": 1.0, "pad": "' + b"p" * 100 + b'"}'
        connection.data_received(
            b"POST /stream HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
        await settle()
        (error,) = parse_responses(bytes(transport.written))
        assert error.status == 413
        assert made.servable.channels == []


async def test_a_stream_needs_the_bearer_token_when_one_is_set() -> None:
    async with teller_harness(auth_token="s3cret") as made:
        connection, transport = made.connect()
        connection.data_received(post(1.0, "/stream", NDJSON))
        await settle()
        connection.data_received(post(1.0, "/stream", NDJSON + b"authorization: Bearer s3cret\r\n"))
        await settle()
        made.servable.channels[-1].finish()
        await settle()
        refused, streamed = transport.responses()
        assert refused.status == 401
        assert streamed.status == 200
        assert len(made.servable.channels) == 1
