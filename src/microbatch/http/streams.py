"""Streams over HTTP: Server-Sent Events, newline-delimited JSON, or msgpack
messages back to back, chosen by ``Accept``; one message per chunk, then one final
message with the stream's end (complete, or the item's own error).

The response starts only once the first chunk (or the end) is there, so an error
before the first chunk is an ordinary error response with its status (504 for a
deadline, 503 for overload); an error after it is the final message. A client that
disconnects mid-stream leaves the stream: its place is freed at the next step.

What the three framings look like for a stream of two chunks::

    text/event-stream                     application/x-ndjson
    event: chunk                          {"chunk":"Hel"}
    data: "Hel"                           {"chunk":"lo"}
                                          {"end":{"status":"complete","chunks":2}}
    event: chunk
    data: "lo"

    event: end
    data: {"status":"complete","chunks":2}

and an error after the first chunk: ``event: error`` with
``data: {"error":"DeadlineExceeded","message":"...","status":504}`` (SSE), or
``{"error":{"error":...,"message":...,"status":...}}`` (NDJSON, msgpack).
"""

from __future__ import annotations

import asyncio
import copy
import math
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..streams import stop_reading
from .asgi import (
    BODY_WRITER_EXTENSION,
    DISCONNECT_EXTENSION,
    Receive,
    Scope,
    Send,
    extension,
)
from .codecs import NotAcceptable
from .status import BadRequest
from .stream_writer import NDJSON, SSE, STREAM_MSGPACK, Framing, StreamOut, write_stream

__all__ = [
    "CLIENT_CLOSED",
    "FIRST_CHUNK_TIMEOUT_HEADER",
    "NDJSON",
    "SSE",
    "STREAM_MSGPACK",
    "Framing",
    "StreamOut",
    "add_stream_operations",
    "first_chunk_timeout_from",
    "framing_for_accept",
    "send_stream",
    "wants_stream",
    "write_stream",
]

CLIENT_CLOSED = 499
"""Recorded in metrics when the client left mid-stream: nobody is left to answer."""

FIRST_CHUNK_TIMEOUT_HEADER = b"x-first-chunk-timeout-ms"
"""A client bounds the wait for its stream's first chunk with this header
(milliseconds); ``X-Request-Timeout-Ms`` bounds the whole stream."""

_BY_MEDIA_TYPE = {
    b"text/event-stream": SSE,
    b"application/x-ndjson": NDJSON,
    b"application/jsonl": NDJSON,
    b"application/jsonlines": NDJSON,
    b"application/json": NDJSON,  # `curl --json` asks for it: each line is JSON
    b"application/msgpack": STREAM_MSGPACK,
    b"application/x-msgpack": STREAM_MSGPACK,
    b"application/vnd.msgpack": STREAM_MSGPACK,
}


_FRAMING_BY_ACCEPT: dict[bytes, Framing] = {}
_MAX_REMEMBERED_ACCEPTS = 64  # clients send few distinct values: most streams hit


def framing_for_accept(accept: bytes | None) -> Framing:
    """The framing ``Accept`` asks for first; SSE without ``Accept`` or for ``*/*``.

    Raises:
        NotAcceptable: ``Accept`` names none of them.
    """
    if accept is None:
        return SSE
    if type(accept) is not bytes:  # unhashable (a bytearray): not remembered
        return _negotiate(bytes(accept))
    framing = _FRAMING_BY_ACCEPT.get(accept)
    if framing is None:
        framing = _negotiate(accept)
        if len(_FRAMING_BY_ACCEPT) < _MAX_REMEMBERED_ACCEPTS:
            _FRAMING_BY_ACCEPT[accept] = framing
    return framing


def _negotiate(accept: bytes) -> Framing:
    """The first framing ``accept`` names (see :func:`framing_for_accept`)."""
    for media_range in accept.split(b","):
        media_type = media_range.split(b";", 1)[0].strip().lower()
        framing = _BY_MEDIA_TYPE.get(media_type)
        if framing is not None:
            return framing
        if media_type in (b"*/*", b"text/*"):
            return SSE
    raise NotAcceptable(
        f"Accept {accept.decode('latin-1')!r} names none of text/event-stream,"
        " application/x-ndjson, application/msgpack"
    )


_STREAM_KINDS = frozenset((b"text/event-stream", b"application/x-ndjson", b"application/jsonl"))
_WANTS_STREAM: dict[bytes, bool] = {}


def wants_stream(accept: bytes | None) -> bool:
    """Whether ``Accept`` asks for a stream (SSE or NDJSON) rather than one answer
    (asked on every predict request of a model that streams: the answers for a few
    values are remembered)."""
    if accept is None:
        return False
    if type(accept) is not bytes:  # a bytearray: hashable as bytes
        accept = bytes(accept)
    wanted = _WANTS_STREAM.get(accept)
    if wanted is None:
        kinds = {part.split(b";", 1)[0].strip().lower() for part in accept.split(b",")}
        wanted = not kinds.isdisjoint(_STREAM_KINDS)
        if len(_WANTS_STREAM) < _MAX_REMEMBERED_ACCEPTS:
            _WANTS_STREAM[accept] = wanted
    return wanted


def first_chunk_timeout_from(given: bytes | None) -> float | None:
    """Seconds the client waits for the first chunk, from its
    ``X-First-Chunk-Timeout-Ms`` value (None: no such header).

    Raises:
        BadRequest: The value is not a number of milliseconds > 0.
    """
    if given is None:
        return None
    try:
        milliseconds = float(given)
    except ValueError:
        milliseconds = math.nan
    if not 0 < milliseconds < math.inf:
        raise BadRequest("X-First-Chunk-Timeout-Ms must be a number of milliseconds > 0")
    return milliseconds / 1000.0


async def send_stream(
    scope: Scope, receive: Receive, send: Send, chunks: AsyncIterator[Any], framing: Framing
) -> int:
    """Send ``chunks`` as one streaming ASGI response; return the status for metrics
    (:data:`CLIENT_CLOSED` when the client left first).

    Raises:
        Exception: The stream's error before its first chunk (the caller answers it
            with its status).
    """
    task = asyncio.current_task()
    assert task is not None
    watching, gone = True, False

    def cancel() -> None:
        nonlocal gone
        if watching:
            gone = True
            task.cancel()

    disconnect = extension(scope, DISCONNECT_EXTENSION)
    watcher: asyncio.Task[None] | None = None
    if disconnect is not None:
        disconnect["register"](cancel)
    else:
        watcher = asyncio.get_running_loop().create_task(_on_disconnect(receive, cancel))
    writer = extension(scope, BODY_WRITER_EXTENSION)
    try:
        return await write_stream(
            _AsgiOut(send, framing, None if writer is None else writer["write"]), chunks, framing
        )
    except asyncio.CancelledError:
        if not gone:
            raise
        if sys.version_info >= (3, 11):
            task.uncancel()
        return CLIENT_CLOSED
    finally:
        watching = False
        if watcher is not None:
            watcher.cancel()
        await stop_reading(chunks)


class _AsgiOut:
    """:class:`StreamOut` over an ASGI ``send`` (and the server's body writer, when
    it offers one)."""

    __slots__ = ("_framing", "_send", "_write")

    def __init__(self, send: Send, framing: Framing, write: Callable[[bytes], bool] | None) -> None:
        self._send = send
        self._framing = framing
        self._write = write

    async def begin(self, first: bytes) -> None:
        await self._send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", self._framing.media_type),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),  # proxies: pass each message on at once
                ],
            }
        )
        if first:
            await self.more(first)

    def begin_now(self, first: bytes) -> bool:
        return False  # the head goes by send(), which waits

    async def more(self, body: bytes) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": True})

    def write_now(self, body: bytes) -> bool:
        return self._write is not None and self._write(body)

    async def end(self, final: bytes) -> None:
        await self._send({"type": "http.response.body", "body": final, "more_body": False})

    @property
    def writes_now(self) -> bool:
        """Whether the server gave a body writer."""
        return self._write is not None

    @property
    def begins_now(self) -> bool:
        """Never: the head goes by ``send()``."""
        return False


async def _on_disconnect(receive: Receive, cancel: Callable[[], None]) -> None:
    """Call ``cancel`` when the client disconnects (the body has been read: the
    server answers ``receive()`` only when the client goes away)."""
    if (await receive())["type"] == "http.disconnect":
        cancel()


def add_stream_operations(openapi: dict[str, Any], paths: dict[str, str]) -> None:
    """Document each stream path (``{"/stream": "/predict", ...}``) in ``openapi``:
    the same request as its predict path; the answer a stream of chunks."""
    for path, predict in paths.items():
        operation = copy.deepcopy(openapi["paths"][predict]["post"])
        operation["summary"] = "The item's chunks as they are made (SSE, NDJSON or msgpack)"
        operation["operationId"] = "stream" + predict.removeprefix("/predict").replace("/", "_")
        operation.setdefault("parameters", []).append(
            {
                "name": "X-First-Chunk-Timeout-Ms",
                "in": "header",
                "required": False,
                "description": "504 if no chunk came within this many milliseconds",
                "schema": {"type": "number", "exclusiveMinimum": 0},
            }
        )
        message = {"type": "string", "description": "one message per chunk, then the end"}
        operation["responses"]["200"] = {
            "description": "Chunks as they come, then the end or the item's error",
            "content": {
                framing.media_type.decode(): {"schema": message}
                for framing in (SSE, NDJSON, STREAM_MSGPACK)
            },
        }
        openapi["paths"][path] = {"post": operation}
