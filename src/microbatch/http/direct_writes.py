"""A step's chunks of many streams written in one callback of the event loop
(:class:`DirectWriter`, :class:`Outbox`), rather than by each stream's writer task
taking a turn per step: what :func:`~.streams.write_stream` hands a stream to after
its first chunk, when both the stream and the transport allow it."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

__all__ = ["DirectOut", "DirectWriter", "Outbox"]


class DirectWriter:
    """Writes one stream's chunks straight to its connection while its writer task
    waits: the step loop queues a step's chunks and the :class:`Outbox` writes them
    all in one callback, rather than each stream's task taking a turn of the event
    loop per step. Where the transport can send the head from a callback too, the
    first chunk goes out this way with the head. A chunk it cannot write now (the
    client reads slowly, or it does not encode) goes back to the task, which then
    writes it (waiting for the client) or ends the stream with the error.
    """

    __slots__ = ("_encode", "_out", "_outbox", "_queued", "_stream", "begun", "sent")

    def __init__(
        self, stream: Any, encode: Callable[[Any], bytes], out: DirectOut, outbox: Outbox
    ) -> None:
        self._stream = stream
        self._encode = encode
        self._out = out
        self._outbox = outbox
        self._queued = False
        self.begun = False
        """The head went out (from here, with the first chunks, or from the task)."""
        self.sent = 0
        """Chunks written from here."""

    @classmethod
    def for_stream(
        cls, chunks: AsyncIterator[Any], encode: Callable[[Any], bytes], out: DirectOut
    ) -> DirectWriter | None:
        """A writer for ``chunks`` (each message made by ``encode``) to ``out``, if
        both the stream and ``out`` allow it."""
        if not out.writes_now or not hasattr(chunks, "on_chunk") or not hasattr(chunks, "unread"):
            return None
        return cls(chunks, encode, out, Outbox.of(asyncio.get_running_loop()))

    def attach(self) -> bool:
        """From now on the stream's chunks come here (the task waits for the end),
        if they can: False while the head is still to go and only the task can send
        it."""
        if not self.begun and not self._out.begins_now:
            return False
        self._stream.on_chunk(self._came)
        return True

    def detach(self) -> None:
        """The chunks go to the task again."""
        self._stream.on_chunk(None)

    def _came(self) -> None:
        if not self._queued:
            self._queued = True
            self._outbox.add(self)

    def flush(self) -> None:
        """Write the chunks that came; hand them back to the task if that cannot be."""
        self._queued = False
        ready: list[Any] = self._stream.take_ready()
        if not ready:
            return
        if self._stream.ended:  # the task writes them with the end, in one write
            self._stream.unread(ready)
            return
        encode = self._encode
        try:  # one chunk per step, as a rule
            data = encode(ready[0]) if len(ready) == 1 else b"".join(map(encode, ready))
        except (TypeError, ValueError, NotImplementedError, OverflowError):
            written = False  # the task encodes them again, and ends with the error
        else:
            if self.begun:
                written = self._out.write_now(data)
            else:
                written = self.begun = self._out.begin_now(data)
        if written:
            self.sent += len(ready)
            return
        self.detach()
        self._stream.unread(ready)


class DirectOut(Protocol):
    """What a :class:`DirectWriter` writes to, from a plain callback: the part of
    :class:`~microbatch.http.stream_writer.StreamOut` that does not wait."""

    @property
    def writes_now(self) -> bool:
        """Whether :meth:`write_now` can ever write (else every chunk goes by the
        task)."""

    @property
    def begins_now(self) -> bool:
        """Whether :meth:`begin_now` can ever begin (else the head goes by the task)."""

    def begin_now(self, first: bytes) -> bool:
        """Send the head and the first message at once and return True; or send
        nothing and return False (the client is gone)."""

    def write_now(self, body: bytes) -> bool:
        """Write one more message at once and return True; or write nothing and
        return False (the client is gone or reads slowly)."""


class Outbox:
    """The direct writers with chunks to write, written in one callback of the event
    loop (scheduled by the first chunk of a step; it runs once the step loop has
    started the next step)."""

    __slots__ = ("_due", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: list[DirectWriter] = []

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Outbox:
        """The loop's outbox."""
        outbox = _OUTBOXES.get(loop)
        if outbox is None:
            outbox = _OUTBOXES[loop] = cls(loop)
        return outbox

    def add(self, writer: DirectWriter) -> None:
        """``writer`` has chunks to write."""
        if not self._due:
            self._loop.call_soon(self._flush)
        self._due.append(writer)

    def _flush(self) -> None:
        due, self._due = self._due, []
        for writer in due:
            writer.flush()


_OUTBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbox] = (
    weakref.WeakKeyDictionary()
)
