"""How a streaming response is written: the three framings (:class:`Framing`) and
the chunk loop (:func:`write_stream`) over the one contract with a transport
(:class:`StreamOut`). Run for every chunk of every stream, so the wheel compiles
this module; :mod:`microbatch.http.streams` describes the framings and re-exports
all of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from .codecs import encode_hook
from .direct_writes import DirectOut, DirectWriter
from .status import UnencodableResult, error_reply

__all__ = ["NDJSON", "SSE", "STREAM_MSGPACK", "Framing", "StreamOut", "write_stream"]

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


class StreamOut(DirectOut, Protocol):
    """Where :func:`write_stream` writes one streaming response: the one contract
    between the chunk loop and a transport (the ASGI ``send``, or ``microbatch
    serve``'s connection). What it can do from a plain callback (``writes_now``,
    ``write_now``, ``begins_now``, ``begin_now``) is the :class:`DirectOut` a
    :class:`~.direct_writes.DirectWriter` writes to; while the task writes, it waits
    here."""

    async def begin(self, first: bytes) -> None:
        """Send the response's head (200) and its first message (may be empty)."""

    async def more(self, body: bytes) -> None:
        """Send one more message, waiting while the client reads slower than we write."""

    async def end(self, final: bytes) -> None:
        """Send the last message: the response is complete."""


_ENCODING_ERRORS = (TypeError, ValueError, NotImplementedError, OverflowError)


async def write_stream(out: StreamOut, chunks: AsyncIterator[Any], framing: Framing) -> int:
    """Write ``chunks`` to ``out`` as ``framing``'s messages: the head with the first
    chunk, the next chunks as they come, then the end or, once a chunk came, the
    stream's error as the final message. Returns 200.

    Where both the stream and ``out`` allow it, the chunks (the first one and the
    head too) are written from one callback for every stream a step served (see
    :class:`~.direct_writes.DirectWriter`), and this task wakes only for the end, or
    for chunks that could not be written then.

    Raises:
        Exception: The stream's error before its first chunk (nothing was sent: the
            caller answers it with its status).
    """
    direct = DirectWriter.for_stream(chunks, framing.chunk, out)
    take_ready: Callable[[], list[Any]] | None = getattr(chunks, "take_ready", None)
    begun = False  # the head went out (here, or from the direct writer)
    sent = 0  # chunks written or held here (the direct writer counts its own)
    held = b""  # the last chunks of a stream that has ended: they go with its end
    try:
        while True:
            # Chunks that piled up while this writer waited go in one write.
            ready = [] if take_ready is None else take_ready()
            if not ready:
                attached = direct is not None and direct.attach()
                try:
                    ready = [await chunks.__anext__()]
                except StopAsyncIteration:
                    pass  # the stream ended: ready stays empty
                finally:
                    if attached and direct is not None:
                        direct.detach()
                if not ready:
                    break
                if take_ready is not None:
                    ready += take_ready()
            begun = begun or (direct is not None and direct.begun)
            try:
                data = b"".join([framing.chunk(one) for one in ready])
            except _ENCODING_ERRORS as error:
                if not begun and not sent:
                    raise UnencodableResult(
                        f"a chunk cannot be encoded for {framing.media_type.decode()}"
                    ) from error
                raise
            sent += len(ready)
            if getattr(chunks, "ended", False):  # the next __anext__ does not wait
                held += data
            elif begun:
                await out.more(data)
            else:
                await out.begin(data)
                begun = True
                if direct is not None:
                    direct.begun = True  # the next chunks may go from its callback
    except Exception as error:  # once a chunk came: the final message says it
        begun = begun or (direct is not None and direct.begun)
        if not (begun or sent):
            raise  # nothing came: the caller answers with the error's status
        if not begun:
            await out.begin(b"")
        reply = error_reply(error)
        told = {"error": reply.error, "message": reply.message, "status": reply.status}
        await out.end(held + framing.error(told))
        return 200
    if direct is not None:
        begun = begun or direct.begun
        sent += direct.sent
    if not begun:
        await out.begin(b"")
    await out.end(held + framing.end({"status": "complete", "chunks": sent}))
    return 200
