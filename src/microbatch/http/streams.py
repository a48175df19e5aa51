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
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from ..streams import stop_reading
from .asgi import (
    BODY_WRITER_EXTENSION,
    DISCONNECT_EXTENSION,
    Receive,
    Scope,
    Send,
    extension,
)
from .codecs import NotAcceptable, encode_hook
from .direct_writes import DirectWriter
from .status import BadRequest, UnencodableResult, error_reply

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

_json = msgspec.json.Encoder(enc_hook=encode_hook)
_msgpack = msgspec.msgpack.Encoder(enc_hook=encode_hook)


@dataclass(frozen=True)
class Framing:
    """One way of writing a stream: its media type and how each message looks."""

    name: str
    media_type: bytes
    chunk: Callable[[Any], bytes]
    end: Callable[[dict[str, Any]], bytes]
    error: Callable[[dict[str, Any]], bytes]


def _sse(event: str, data: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


SSE = Framing(
    "sse",
    b"text/event-stream",
    chunk=lambda value: _sse("chunk", _json.encode(value)),
    end=lambda end: _sse("end", _json.encode(end)),
    error=lambda error: _sse("error", _json.encode(error)),
)
"""Server-Sent Events: ``event: chunk`` per chunk, then ``event: end`` or ``event: error``."""

NDJSON = Framing(
    "ndjson",
    b"application/x-ndjson",
    chunk=lambda value: _json.encode({"chunk": value}) + b"\n",
    end=lambda end: _json.encode({"end": end}) + b"\n",
    error=lambda error: _json.encode({"error": error}) + b"\n",
)
"""One JSON object per line: ``{"chunk": ...}``, then ``{"end": ...}`` or ``{"error": ...}``."""

STREAM_MSGPACK = Framing(
    "msgpack",
    b"application/msgpack",
    chunk=lambda value: _msgpack.encode({"chunk": value}),
    end=lambda end: _msgpack.encode({"end": end}),
    error=lambda error: _msgpack.encode({"error": error}),
)
"""The NDJSON messages as msgpack maps back to back (msgpack delimits itself)."""

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


class StreamOut(Protocol):
    """Where :func:`write_stream` writes one streaming response: the one contract
    between the chunk loop and a transport (the ASGI ``send``, or ``microbatch
    serve``'s connection)."""

    @property
    def writes_now(self) -> bool:
        """Whether :meth:`write_now` can ever write (else every chunk goes by
        :meth:`more`)."""

    async def begin(self, first: bytes) -> None:
        """Send the response's head (200) and its first message (may be empty)."""

    async def more(self, body: bytes) -> None:
        """Send one more message, waiting while the client reads slower than we write."""

    def write_now(self, body: bytes) -> bool:
        """Write one more message at once, from a plain callback, and return True; or
        write nothing and return False (the client is gone or reads slowly)."""

    async def end(self, final: bytes) -> None:
        """Send the last message: the response is complete."""


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


async def write_stream(out: StreamOut, chunks: AsyncIterator[Any], framing: Framing) -> int:
    """Write ``chunks`` to ``out`` as ``framing``'s messages: the head with the first
    chunk, the next chunks as they come (those a step made for many streams are
    written from one callback, see :class:`~.direct_writes.DirectWriter`), then the end or, after
    the first chunk, the stream's error as the final message. Returns 200.

    Raises:
        Exception: The stream's error before its first chunk (nothing was sent: the
            caller answers it with its status).
    """
    try:
        first: bytes | None = framing.chunk(await chunks.__anext__())
    except StopAsyncIteration:
        first = None
    except (TypeError, ValueError, NotImplementedError, OverflowError) as error:
        raise UnencodableResult(
            f"a chunk cannot be encoded for {framing.media_type.decode()}"
        ) from error
    sent = 0
    held = b""  # the last chunks of a stream that has ended: they go with its end
    if first is None:
        await out.begin(b"")
    else:
        await out.begin(first)
        sent = 1
        take_ready: Callable[[], list[Any]] | None = getattr(chunks, "take_ready", None)
        write_now = out.write_now if out.writes_now else None
        direct = DirectWriter.for_stream(chunks, framing.chunk, write_now)
        try:
            while True:
                # Chunks that piled up while this writer waited go in one write.
                ready = [] if take_ready is None else take_ready()
                if not ready:
                    if direct is not None:
                        direct.attach()  # the next chunks go out without this task
                    try:
                        ready = [await chunks.__anext__()]
                    except StopAsyncIteration:
                        break
                    finally:
                        if direct is not None:
                            direct.detach()
                    if take_ready is not None:
                        ready += take_ready()
                data = b"".join(framing.chunk(one) for one in ready)
                sent += len(ready)
                if getattr(chunks, "ended", False):  # the next __anext__ does not wait
                    held += data
                else:
                    await out.more(data)
        except Exception as error:  # after the first chunk: the final message says it
            reply = error_reply(error)
            await out.end(
                held
                + framing.error(
                    {"error": reply.error, "message": reply.message, "status": reply.status}
                )
            )
            return 200
        if direct is not None:
            sent += direct.sent
    await out.end(held + framing.end({"status": "complete", "chunks": sent}))
    return 200


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
