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
from .direct_writes import DirectWriter
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


async def write_stream(out: StreamOut, chunks: AsyncIterator[Any], framing: Framing) -> int:
    """Write ``chunks`` to ``out`` as ``framing``'s messages: the head with the first
    chunk, the next chunks as they come (those a step made for many streams are
    written from one callback, see :class:`~.direct_writes.DirectWriter`), then the
    end or, after the first chunk, the stream's error as the final message. Returns
    200.

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
                        pass  # the stream ended: ready stays empty
                    finally:
                        if direct is not None:
                            direct.detach()
                    if not ready:
                        break
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
