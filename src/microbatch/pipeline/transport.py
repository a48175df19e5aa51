"""Messages between the serving process and its workers, over a duplex pipe.

One message is a pickle (protocol 5). Buffers (numpy arrays, bytearrays) under
:data:`~.arena.ARENA_MIN_BYTES` stay inside the pickle; larger ones travel out of
band: through the worker's shared-memory arena when the message belongs to a batch
slot, else as pipe frames of their own. A pickle that is itself that large (big
``bytes`` or strings inside) goes through the arena too. The first pipe frame is
the header: the slot and the number of parts; if there are any, where each lies
(an arena offset and length, or "the next frame"), the pickle's first; then the
pickle, if it is in band. So a small message is one frame: its slot, its pickle.
The receiver copies every part out, so what it unpickles owns its memory. Only our
own processes are on these pipes: nothing here ever reads data that came from the
network.
"""

from __future__ import annotations

import math
import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from .arena import ARENA_MIN_BYTES, Segment, new_buffer

__all__ = [
    "Incoming",
    "Source",
    "begin",
    "encode",
    "read_message",
    "receive",
    "send",
    "unpicklable",
]

_HEAD = struct.Struct("<BIdd")  # slot (255: none), parts (0: the pickle follows), two times
_PART = struct.Struct("<qQ")  # offset in the arena (or one of the two below), length
_NO_SLOT = 255
_INLINE = -1  # the pickle, in the header frame after the parts
_FRAME = -2  # a pipe frame of its own, after the header


class Source(Protocol):
    """Where the receiver copies arena parts from (a :class:`~.arena.Segment`)."""

    def read(self, offset: int, length: int) -> Any:
        """A copy of ``length`` bytes at ``offset``: a writable buffer."""
        ...


def send(
    conn: Connection,
    message: Any,
    slot: int | None = None,
    arena: Segment | None = None,
    times: tuple[float, float] = (math.nan, math.nan),
) -> None:
    """Send ``message`` for batch slot ``slot``; its large parts go into ``arena``
    (the slot's outgoing file) if given and it has room, else into pipe frames.
    Blocks until the pipe has taken every frame."""
    for frame in encode(message, slot, arena, times):
        conn.send_bytes(frame)


def encode(
    message: Any,
    slot: int | None = None,
    arena: Segment | None = None,
    times: tuple[float, float] = (math.nan, math.nan),
) -> list[bytes | memoryview]:
    """The pipe frames of ``message`` (see :func:`send`); its large parts are written
    into ``arena`` now, where they fit.

    Raises:
        Exception: ``message`` cannot be pickled (nothing was written anywhere).
    """
    large: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < ARENA_MIN_BYTES:
            return True  # true: pickled in band
        large.append(raw)
        return False

    body = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
    tag = _NO_SLOT if slot is None else slot
    if not large and len(body) < ARENA_MIN_BYTES:  # the common case: one small frame
        return [_HEAD.pack(tag, 0, *times) + body]
    parts = [(_INLINE, len(body))] + [(_FRAME, raw.nbytes) for raw in large]
    if arena is not None and slot is not None:
        parts = _place(arena, body, large) or parts
    head = [_HEAD.pack(tag, len(parts), *times)]
    head += [_PART.pack(*part) for part in parts]
    if parts[0][0] == _INLINE:
        head.append(body)
    frames: list[bytes | memoryview] = [b"".join(head)]
    frames += [raw for raw, (offset, _) in zip(large, parts[1:], strict=True) if offset == _FRAME]
    return frames


def unpicklable(items: Sequence[Any]) -> dict[int, Exception]:
    """The items that cannot be pickled, by index, with the reason of each."""
    failed: dict[int, Exception] = {}
    for index, item in enumerate(items):
        try:
            pickle.dumps(item, protocol=5, buffer_callback=_discard)
        except Exception as exc:
            failed[index] = exc
    return failed


def _discard(buffer: pickle.PickleBuffer) -> None:
    """Out-of-band buffers need not be copied just to learn that an object pickles."""


def _place(arena: Segment, body: bytes, large: list[memoryview]) -> list[tuple[int, int]] | None:
    """Write the parts into the arena, back to back; their places, or None if the
    arena cannot grow to hold them (the pipe carries them then)."""
    chunks = [memoryview(body) if len(body) >= ARENA_MIN_BYTES else None, *large]
    try:
        arena.reserve(sum(chunk.nbytes for chunk in chunks if chunk is not None))
    except OSError:
        return None
    places, offset = [], 0
    for chunk in chunks:
        if chunk is None:
            places.append((_INLINE, len(body)))
            continue
        arena.write(offset, chunk)
        places.append((offset, chunk.nbytes))
        offset += chunk.nbytes
    return places


@dataclass(slots=True)
class Incoming:
    """A message read off the pipe, its arena parts not yet copied out."""

    slot: int | None  # the batch slot it belongs to
    head: bytes  # the header frame
    parts: list[tuple[int, int]]  # (offset or _INLINE/_FRAME, length): the pickle, buffers
    frames: list[bytes]  # the parts that came as pipe frames, in order
    arena_bytes: int  # how many bytes :meth:`decode` copies out of the arena
    times: tuple[float, float] = field(default=(math.nan, math.nan))  # stamped by the sender

    @property
    def frames_expected(self) -> int:
        """How many pipe frames follow the header frame."""
        return sum(1 for at, _ in self.parts[1:] if at == _FRAME)

    def decode(self, source: Source | None) -> Any:
        """Copy the arena parts out of ``source`` (the slot's incoming file) and unpickle.

        Raises:
            OSError: An arena part is missing.
            Exception: Whatever unpickling raises (a class this process cannot import).
        """
        if not self.parts:
            return pickle.loads(memoryview(self.head)[_HEAD.size :])
        (offset, length), *buffers = self.parts
        if offset == _INLINE:
            start = _HEAD.size + len(self.parts) * _PART.size
            body = memoryview(self.head)[start : start + length]
        else:
            body = self._copy(source, offset, length)
        frames = iter(self.frames)
        copies = [
            _writable(next(frames)) if at == _FRAME else self._copy(source, at, size)
            for at, size in buffers
        ]
        return pickle.loads(body, buffers=copies)

    @staticmethod
    def _copy(source: Source | None, offset: int, length: int) -> Any:
        if source is None:
            raise OSError("the message has parts in an arena, and none was given")
        return source.read(offset, length)


def read_message(conn: Connection) -> Incoming:
    """Read one message sent by :func:`send` off the pipe (blocks until it is
    complete); :meth:`Incoming.decode` makes the object."""
    message = begin(conn.recv_bytes())
    message.frames = [conn.recv_bytes() for _ in range(message.frames_expected)]
    return message


def begin(head: bytes) -> Incoming:
    """The message whose header frame is ``head``; its :attr:`Incoming.frames` are
    still to come (:attr:`Incoming.frames_expected` of them)."""
    tag, count, first, second = _HEAD.unpack_from(head)
    slot = None if tag == _NO_SLOT else tag
    if not count:
        return Incoming(slot, head, [], [], 0, (first, second))
    parts = [_PART.unpack_from(head, _HEAD.size + i * _PART.size) for i in range(count)]
    arena_bytes = sum(n for at, n in parts if at >= 0)
    return Incoming(slot, head, parts, [], arena_bytes, (first, second))


def _writable(frame: bytes) -> Any:
    """A frame as writable memory, so that arrays arrive writable whichever way they came."""
    out = new_buffer(len(frame))
    with memoryview(out) as copy:
        copy[:] = frame
    return out


def receive(conn: Connection, source: Source | None = None) -> Any:
    """Read and decode one message sent by :func:`send`."""
    return read_message(conn).decode(source)
