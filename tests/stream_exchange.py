"""The stream exchange a server of ``tests.streams.served:service`` must get right over
HTTP, one process or ``serve --workers``: SSE by default, an endless stream that its
client leaves, then NDJSON when asked for.

Used by ``tests/streams/test_http_streams.py`` and ``tests/serve/test_workers_protocols.py``.
"""

from __future__ import annotations

import json

import httpx

__all__ = ["check_stream_exchange"]


def check_stream_exchange(client: httpx.Client) -> None:
    """Stream ``a:3`` as SSE, leave an endless stream after its first chunk, then stream
    ``b:2`` as NDJSON.

    The service steps one item at a time: the endless stream whose client left must be
    cancelled (in the hub, under ``--workers``), or the third would never start.
    """
    with client.stream("POST", "/stream", json="a:3") as reply:
        assert reply.headers["content-type"] == "text/event-stream"
        lines = [line for line in reply.iter_lines() if line]
    assert lines == [
        "event: chunk",
        'data: "a-0"',
        "event: chunk",
        'data: "a-1"',
        "event: chunk",
        'data: "a-2"',
        "event: end",
        'data: {"status":"complete","chunks":3}',
    ]
    with client.stream("POST", "/stream", json="pid") as endless:
        for line in endless.iter_lines():
            if line.startswith("data:"):
                break
    with client.stream(
        "POST", "/stream", json="b:2", headers={"accept": "application/x-ndjson"}
    ) as reply:
        assert [json.loads(line) for line in reply.iter_lines() if line] == [
            {"chunk": "b-0"},
            {"chunk": "b-1"},
            {"end": {"status": "complete", "chunks": 2}},
        ]
