"""The streaming benchmark's HTTP client (``benchmarks/stream_client.py``) counts a
response's chunks and sees its end: when the server closes (a new connection per
stream), or, kept alive, at the chunked body's last chunk, however the bytes come
split; a response it cannot see the end of fails rather than hangs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.benchmark_modules import load_benchmark

stream_client = load_benchmark("stream_client")

HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunked(*messages: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(m), m) for m in messages) + b"0\r\n\r\n"


BODY = _chunked(b'{"chunk":"@"}\n', b'{"chunk":"@"}\n{"chunk":"@"}\n', b'{"end":{}}\n')


class FakeTransport:
    """What the counter writes to and closes."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _counter(keep_alive: bool) -> Any:
    counter = stream_client.ChunkCounter(keep_alive)
    counter.connection_made(FakeTransport())
    return counter


def _feed(counter: Any, data: bytes, size: int) -> None:
    for start in range(0, len(data), size):
        counter.data_received(data[start : start + size])


@pytest.mark.parametrize("size", [1, 2, 5, 7, 1000])
async def test_a_kept_alive_response_ends_at_its_last_chunk(size: int) -> None:
    counter = _counter(keep_alive=True)
    for _ in range(2):  # two responses on one connection
        ended = counter.expect()
        response = HEAD + BODY
        _feed(counter, response[:-1], size)
        assert not ended.done()
        counter.data_received(response[-1:])
        assert ended.done() and ended.exception() is None
        assert counter.chunks == 3 and counter.first is not None
        assert counter.head.startswith(b"HTTP/1.1 200")
    assert not counter.lost


async def test_an_empty_kept_alive_body_ends_too() -> None:
    counter = _counter(keep_alive=True)
    ended = counter.expect()
    _feed(counter, HEAD + b"0\r\n\r\n", 3)
    assert ended.done() and counter.chunks == 0


async def test_with_a_new_connection_per_stream_the_end_is_the_close() -> None:
    counter = _counter(keep_alive=False)
    ended = counter.expect()
    _feed(counter, HEAD + BODY, 4)
    assert not ended.done()
    counter.connection_lost(None)
    assert ended.done() and counter.chunks == 3 and counter.lost


async def test_a_kept_alive_response_without_chunks_fails() -> None:
    counter = _counter(keep_alive=True)
    ended = counter.expect()
    counter.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n" + b'{"chunk":"@"}\n')
    assert isinstance(ended.exception(), RuntimeError)
    assert counter.transport.closed


async def test_a_client_keeps_its_connection_only_when_kept_alive() -> None:
    kept, fresh = stream_client.StreamClient(True), stream_client.StreamClient(False)
    assert "Connection: close" in fresh.connection_header
    assert kept.connection_header == ""
    counter = _counter(keep_alive=True)
    kept.done(counter)
    assert await kept.connection(("127.0.0.1", 9)) is counter  # reused, not reconnected
    other = _counter(keep_alive=False)
    fresh.done(other)
    assert other.transport.closed


def test_an_openai_contender_asks_for_a_chat_completion_of_that_many_tokens() -> None:
    import json

    contenders = load_benchmark("stream_contenders")
    (openai,) = [c for c in contenders.HTTP_CONTENDERS if c.openai and "microbatch" in c.label]
    asked = json.loads(openai.body(37))
    assert asked["max_tokens"] == 37 and asked["stream"] is True
    assert asked["messages"] == [{"role": "user", "content": "go"}]
    assert openai.path == "/v1/chat/completions"
    (plain,) = [c for c in contenders.HTTP_CONTENDERS if c.label.endswith("(HTTP, NDJSON)")][:1]
    assert json.loads(plain.body(37)) == 37
