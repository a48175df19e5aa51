"""Random byte streams into one connection, split at random points (hypothesis).

(HEAD is left out: a response parser cannot tell a HEAD response has no body;
``test_connection.py`` tests HEAD.)

Valid (streams among them), pipelined and garbage requests: no exception escapes,
every response written is a whole valid HTTP/1.1 response, every valid request of an
all-valid stream is answered in order, every connection ends closed once its
deadlines pass, and nothing is left behind (no task, no armed timer).
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .connection_harness import (
    GET_LIVE,
    LIMITS,
    StreamingDoubler,
    harness,
    parse_responses,
    post,
    settle,
)

VALID = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: (post(x), 1)),
    st.just((GET_LIVE, 1)),
    st.just((b"GET /metrics HTTP/1.1\r\n\r\n", 1)),
    st.just((b"GET /nowhere?q=%20 HTTP/1.1\r\n\r\n", 1)),
    st.just((post(2.0, extra=b"expect: 100-continue\r\n"), 1)),
    st.just((b"POST /predict HTTP/1.1\r\ncontent-length: 3\r\n\r\n{x}", 1)),
    st.floats(-1e6, 1e6, allow_nan=False).map(
        lambda x: (post(x, "/stream", b"accept: application/x-ndjson\r\n"), 1)
    ),
    st.just((post(3.0, "/predict", b"accept: text/event-stream\r\n"), 1)),
    st.just((b"POST /stream HTTP/1.1\r\ncontent-length: 3\r\n\r\n{x}", 1)),
)
GARBAGE = st.one_of(
    st.binary(min_size=1, max_size=64),
    st.just(b"GET / HTTP/9.9\r\n\r\n"),
    st.just(b"POST /predict HTTP/1.1\r\ncontent-length: -1\r\n\r\n"),
    st.just(b"POST /predict HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"),
    st.just(b"GET /health/live HTTP/1.1\r\nx: " + b"y" * 3000 + b"\r\n\r\n"),
    st.just(b"GET /health/live HTTP/1.1\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n"),
    st.just(
        b'POST /predict HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\na\r\n{"x": 1.0}\r\n0\r\n\r\n'
    ),
)


@st.composite
def streams(draw: Any, garbage: bool) -> tuple[bytes, int, list[int]]:
    """A stream of requests, how many responses it asks for, and where it is cut."""
    pieces = draw(
        st.lists(st.one_of(VALID, GARBAGE.map(lambda g: (g, -1))) if garbage else VALID, max_size=6)
    )
    data = b"".join(piece for piece, _ in pieces)
    wanted = sum(count for _, count in pieces)
    cuts = sorted(draw(st.lists(st.integers(0, max(0, len(data))), max_size=8)))
    return data, wanted, cuts


async def feed(stream: tuple[bytes, int, list[int]]) -> tuple[list[int], bool]:
    """Run one connection on the stream; the statuses it got and whether it closed."""
    data, _, cuts = stream
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        async with harness(servable=StreamingDoubler()) as h:
            connection, transport = h.connect()
            start = 0
            for cut in [*cuts, len(data)]:
                if cut > start and not transport.closed:
                    connection.data_received(data[start:cut])
                    await settle()
                start = max(start, cut)
            await settle()
            await h.advance(LIMITS.body_timeout_s + LIMITS.header_timeout_s + 1)
            await h.advance(LIMITS.header_timeout_s + 1)
            statuses = [r.status for r in parse_responses(bytes(transport.written))]
            closed = transport.closed
    finally:
        loop.set_exception_handler(None)
    assert errors == []
    return statuses, closed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(garbage=False))
def test_valid_streams_are_answered_in_full_and_in_order(
    stream: tuple[bytes, int, list[int]],
) -> None:
    statuses, closed = asyncio.run(feed(stream))
    answered = [status for status in statuses if status != 100]
    assert len(answered) == stream[1]
    assert all(100 <= status < 600 for status in answered)
    assert closed  # past every deadline, an idle connection is closed


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(garbage=True))
def test_any_stream_gets_valid_responses_or_a_close(stream: tuple[bytes, int, list[int]]) -> None:
    statuses, closed = asyncio.run(feed(stream))
    assert all(100 <= status < 600 for status in statuses)
    assert closed
