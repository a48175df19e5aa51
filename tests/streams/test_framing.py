"""Choosing a stream's framing from ``Accept``: the same answer every time a value
comes again (the choice is remembered per value), and a refusal every time."""

from __future__ import annotations

import pytest

from microbatch.http.codecs import NotAcceptable
from microbatch.http.streams import (
    NDJSON,
    SSE,
    STREAM_MSGPACK,
    framing_for_accept,
    wants_stream,
)


@pytest.mark.parametrize(
    ("accept", "framing"),
    [
        (None, SSE),
        (b"*/*", SSE),
        (b"text/event-stream", SSE),
        (b"application/x-ndjson", NDJSON),
        (b"application/json", NDJSON),
        (b"text/html;q=0.9, Application/MsgPack", STREAM_MSGPACK),
        (b"image/png, text/*", SSE),
    ],
)
def test_the_first_framing_accept_names_again_and_again(
    accept: bytes | None, framing: object
) -> None:
    assert framing_for_accept(accept) is framing
    assert framing_for_accept(accept) is framing  # remembered: the same answer


def test_an_unhashable_accept_is_negotiated_without_being_remembered() -> None:
    assert framing_for_accept(bytearray(b"application/x-ndjson")) is NDJSON  # type: ignore[arg-type]


def test_an_accept_that_names_no_framing_is_refused_each_time() -> None:
    for _ in range(2):
        with pytest.raises(NotAcceptable, match="image/png"):
            framing_for_accept(b"image/png")


@pytest.mark.parametrize(
    ("accept", "wanted"),
    [
        (None, False),
        (b"application/json", False),
        (b"*/*", False),  # a predict path answers once unless a stream is named
        (b"text/event-stream", True),
        (b"TEXT/Event-Stream; charset=utf-8", True),
        (b"application/json, application/x-ndjson;q=0.5", True),
        (b"application/jsonl", True),
        (bytearray(b"text/event-stream"), True),
    ],
)
def test_whether_a_predict_path_streams_again_and_again(accept: bytes | None, wanted: bool) -> None:
    assert [wants_stream(accept) for _ in range(3)] == [wanted] * 3
