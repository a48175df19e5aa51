"""Messages between our own processes over a socket pair: ``serve --workers``'s HTTP
processes and their hub.

Besides the pipeline's worker pipes, this is the one place outside ``pipeline/``
that pickles: the HTTP layer itself never imports pickle.

A :class:`Channel` is one end of a Unix socket pair, as an asyncio protocol. A
message is any picklable value (``serve --workers`` sends the dataclasses of
:mod:`._messages`; items and results travel inside them as pickles of their own, so
that one that cannot be read fails alone); what one side has to say in
one turn of its event loop goes out as one frame (an 8-byte length, then a pickle of
the list of messages): one write for a whole burst of requests or results. Writes
never block the event loop (the transport buffers), so two busy sides cannot
deadlock on full socket buffers.

Only our own processes are on these sockets (the hub makes the pair before it
starts the front): network bytes are never unpickled here; a front decodes request
bodies with msgspec before anything of them is pickled.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Callable
from typing import Any, cast

from ..errors import MicrobatchError, RemoteError

__all__ = ["Channel", "Message", "pack_item", "pack_outcome", "unpack_item", "unpack_outcome"]

Message = object
"""What a :class:`Channel` carries: any picklable value."""

_LENGTH = struct.Struct("<Q")
_JOIN_LIMIT = 64 * 1024  # smaller payloads are copied behind their length: one write


class Channel(asyncio.Protocol):
    """Framed, pickled messages over a stream socket, sent once per loop turn.

    Args:
        on_message: Called with each message that arrives, in order.
        on_lost: Called once when the connection is gone.
    """

    def __init__(self, on_message: Callable[[Message], None], on_lost: Callable[[], None]) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._outbox: list[Message] = []
        self._inbox = bytearray()
        self._lost = False

    @property
    def open(self) -> bool:
        """Connected and not closing."""
        return self._transport is not None and not self._transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport; messages posted before now go out with the next turn."""
        self._transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass
        if self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)

    def post(self, message: Message) -> None:
        """Send ``message`` at the end of this loop turn, with the others posted in it."""
        if not self._outbox and self._transport is not None:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(message)

    def close(self) -> None:
        """Send what is posted, then close."""
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        """Split the stream into frames; hand each frame's messages on."""
        inbox = self._inbox
        inbox += data
        start = 0
        while len(inbox) - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(inbox, start)
            end = start + _LENGTH.size + length
            if len(inbox) < end:
                break
            messages = pickle.loads(inbox[start + _LENGTH.size : end])
            start = end
            for message in messages:
                self._on_message(message)
        if start:
            del inbox[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        """Tell the owner, once."""
        self._transport = None
        self._outbox.clear()
        if not self._lost:
            self._lost = True
            self._on_lost()

    def _flush(self) -> None:
        messages, self._outbox = self._outbox, []
        if not messages or self._transport is None or self._transport.is_closing():
            return
        payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
        head = _LENGTH.pack(len(payload))
        if len(payload) < _JOIN_LIMIT:
            self._transport.write(head + payload)
        else:
            self._transport.writelines((head, payload))


def pack_item(item: Any) -> bytes:
    """An item (decoded by msgspec from a request body) as bytes to relay."""
    return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)


def unpack_item(packed: bytes) -> Any:
    """The item :func:`pack_item` packed (bytes from our own HTTP process)."""
    return pickle.loads(packed)


def pack_outcome(ok: bool, value: Any) -> bytes:
    """A result, or an error, as bytes to send.

    microbatch's own errors cross as they are; any other error becomes a
    :class:`RemoteError` (its class may not unpickle, or not be importable, on the
    other side). A result that cannot be pickled becomes an error of its own item.
    """
    if not ok and not isinstance(value, MicrobatchError):
        value = RemoteError.from_exception(value)
    try:
        return pickle.dumps((ok, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        failure = RemoteError(type(error).__name__, f"the result cannot be pickled: {error}", "")
        return pickle.dumps((False, failure), protocol=pickle.HIGHEST_PROTOCOL)


def unpack_outcome(packed: bytes) -> Any:
    """The result :func:`pack_outcome` packed; its error raised."""
    try:
        ok, value = pickle.loads(packed)
    except Exception as error:
        raise RemoteError(type(error).__name__, f"the result cannot be read: {error}", "") from None
    if not ok:
        raise value
    return value
