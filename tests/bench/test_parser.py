"""The HTTP/1.1 response parser: framing by Content-Length, chunks or close, at any split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from microbatch.bench import ProtocolError, Response, ResponseParser


def feed_in_pieces(data: bytes, cuts: list[int]) -> list[Response]:
    parser = ResponseParser()
    responses: list[Response] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        responses += parser.feed(data[start:cut])
        start = cut
    return responses


def reply(body: bytes, status: int = 200, extra: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n".encode()
    return head + extra + b"\r\n" + body


def test_a_content_length_body_split_at_every_byte() -> None:
    data = reply(b'{"y": 2.0}', extra=b"content-type: application/json\r\n")
    for cut in range(len(data) + 1):
        [response] = feed_in_pieces(data, [cut])
        assert response.status == 200
        assert response.body == b'{"y": 2.0}'
        assert response.headers[b"content-type"] == b"application/json"
        assert response.keep_alive


def test_a_body_containing_a_blank_line_is_not_taken_for_a_head() -> None:
    body = b"a\r\n\r\nHTTP/1.1 500 no\r\n\r\n"
    [response] = ResponseParser().feed(reply(body))
    assert response.body == body


def test_back_to_back_responses_in_one_read_come_out_in_order() -> None:
    data = reply(b"one") + reply(b"", status=404) + reply(b"three", status=503)
    responses = ResponseParser().feed(data)
    assert [(r.status, r.body) for r in responses] == [(200, b"one"), (404, b""), (503, b"three")]


def test_an_incomplete_body_waits_for_more() -> None:
    parser = ResponseParser()
    assert parser.feed(reply(b"0123456789")[:-3]) == []
    assert not parser.idle
    [response] = parser.feed(b"789")
    assert response.body == b"0123456789"
    assert parser.idle


def test_chunked_bodies_with_extensions_and_trailers_split_at_every_byte() -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\n"
    ) + reply(b"next")
    for cut in range(len(data) + 1):
        first, second = feed_in_pieces(data, [cut])
        assert first.body == b"hello 0123456789"
        assert second.body == b"next"


def test_a_body_without_length_runs_to_the_close() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart ") == []
    assert parser.feed(b"and rest") == []
    response = parser.feed_eof()
    assert response is not None
    assert response.body == b"part and rest"
    assert not response.keep_alive


def test_interim_responses_are_skipped_and_204_has_no_body() -> None:
    data = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n" + reply(b"x")
    first, second = ResponseParser().feed(data)
    assert (first.status, first.body) == (204, b"")
    assert second.body == b"x"


@pytest.mark.parametrize(
    ("version", "connection", "keep_alive"),
    [
        (b"HTTP/1.1", b"", True),
        (b"HTTP/1.1", b"connection: close\r\n", False),
        (b"HTTP/1.0", b"", False),
        (b"HTTP/1.0", b"Connection: Keep-Alive\r\n", True),
    ],
)
def test_keep_alive_follows_the_version_and_connection_header(
    version: bytes, connection: bytes, keep_alive: bool
) -> None:
    data = version + b" 200 OK\r\ncontent-length: 0\r\n" + connection + b"\r\n"
    [response] = ResponseParser().feed(data)
    assert response.keep_alive is keep_alive


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0x10\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n",
    ],
)
def test_malformed_responses_raise(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResponseParser().feed(data)


def test_equal_repeated_content_lengths_are_accepted() -> None:
    [response] = ResponseParser().feed(b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok")
    assert response.body == b"ok"


def test_a_head_that_never_ends_is_refused() -> None:
    parser = ResponseParser(max_head_bytes=100)
    with pytest.raises(ProtocolError):
        parser.feed(b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * 50)


def test_a_close_inside_a_length_delimited_body_is_an_error() -> None:
    parser = ResponseParser()
    parser.feed(reply(b"0123456789")[:-1])
    with pytest.raises(ProtocolError):
        parser.feed_eof()
    assert ResponseParser().feed_eof() is None


@given(
    bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=5),
    chunked=st.lists(st.booleans(), min_size=5, max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
def test_any_sequence_of_responses_at_any_split_comes_back_whole(
    bodies: list[bytes], chunked: list[bool], cuts: list[int]
) -> None:
    data = b""
    for body, as_chunks in zip(bodies, chunked, strict=False):
        if as_chunks:
            pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
            framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
            data += b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + framed
        else:
            data += reply(body)
    responses = feed_in_pieces(data, [min(cut, len(data)) for cut in cuts])
    assert [r.body for r in responses] == bodies
