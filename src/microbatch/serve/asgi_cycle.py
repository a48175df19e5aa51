"""One request through the ASGI app, on microbatch's own connection layer.

Every route other than the predict fast path goes this way, so routes added to
:class:`~microbatch.http.app.HttpApp` work under ``microbatch serve`` as they do
under any ASGI server: the body streams in through ``receive()`` (reading pauses
while the app holds more than :data:`HIGH_WATER_BYTES` unread), and the response may
stream out (``more_body``; chunked when it declares no length).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..http.asgi import BODY_WRITER_EXTENSION, Message, Scope
from .responses import date_line, head, status_line

__all__ = ["HIGH_WATER_BYTES", "AsgiCycle", "CycleOwner"]

logger = logging.getLogger("microbatch.serve")

HIGH_WATER_BYTES = 64 * 1024
"""Unread body bytes held for the app before the connection stops reading."""

_DISCONNECT: Message = {"type": "http.disconnect"}
_INTERNAL_ERROR = b"internal server error"
_CLOSE = b"connection: close\r\n"


class CycleOwner(Protocol):
    """What a cycle needs from its connection."""

    def write(self, data: bytes) -> None:
        """Send bytes to the client."""

    def hold_body(self, held: bool) -> None:
        """Stop (True) or resume (False) reading, for the app's body backlog."""

    def response_complete(self, status: int) -> None:
        """The response is out."""

    def abort(self) -> None:
        """Close the connection now (a response cannot be finished)."""

    async def drained(self) -> None:
        """Until the client has read what was written (flow control)."""

    def close_after_response(self) -> None:
        """The response's body runs to the close (HTTP/1.0, no length): close after it."""

    @property
    def writing_paused(self) -> bool:
        """The client reads slower than the server writes (``drained`` would wait)."""


class AsgiCycle:
    """The ``receive`` and ``send`` of one request.

    Args:
        owner: The connection.
        scope: The request's ASGI scope.
        head_only: A HEAD request: the response's body is not sent.
        connection: The ``connection`` header line the response carries, or empty.
    """

    def __init__(self, owner: CycleOwner, scope: Scope, head_only: bool, connection: bytes) -> None:
        self.scope = scope
        self._owner = owner
        self._head_only = head_only
        self._connection = connection
        self._chunks: list[bytes] = []
        self._held = 0
        self._body_done = False
        self._last_body_sent = False
        self._waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.on_disconnect: Callable[[], None] | None = None
        self.started = False
        self.complete = False
        self._status = 0
        self._sent_status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunked = False
        self._http10 = scope.get("http_version") == "1.0"
        extensions = scope.get("extensions")
        if extensions is not None:
            extensions[BODY_WRITER_EXTENSION] = {"write": self.write_more}

    # -- from the connection ------------------------------------------------------

    def body(self, chunk: bytes) -> None:
        """A piece of the request's body arrived."""
        self._chunks.append(chunk)
        self._held += len(chunk)
        if self._held > HIGH_WATER_BYTES:
            self._owner.hold_body(True)
        self._wake()

    def body_complete(self) -> None:
        """The whole body is in."""
        self._body_done = True
        self._wake()

    def disconnect(self) -> None:
        """The client went away: ``receive()`` says so; the app's callback runs once."""
        if self.disconnected:
            return
        self.disconnected = True
        self._wake()
        callback, self.on_disconnect = self.on_disconnect, None
        if callback is not None and not self.complete:
            callback()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the app's side -----------------------------------------------------------

    async def receive(self) -> Message:
        """The next body message; ``http.disconnect`` once the client is gone (or the
        response is complete)."""
        while True:
            if self.disconnected or self.complete:
                return _DISCONNECT
            if self._chunks or (self._body_done and not self._last_body_sent):
                body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
                self._chunks.clear()
                if self._held > HIGH_WATER_BYTES:
                    self._owner.hold_body(False)
                self._held = 0
                more = not self._body_done
                self._last_body_sent = not more
                return {"type": "http.request", "body": body, "more_body": more}
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def send(self, message: Message) -> None:
        """Write a response message (in order: one start, then body parts)."""
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self._status = int(message["status"])
            self._headers = [
                (bytes(name).lower(), bytes(value)) for name, value in message.get("headers", ())
            ]
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started or self.complete:
            raise RuntimeError("http.response.body outside a response")
        if self.disconnected:
            return
        body = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        out = self._head(len(body), more) if self._status else b""
        self._status_sent()
        if not self._head_only:
            if self._chunked:
                if body:
                    out += b"%x\r\n%s\r\n" % (len(body), body)
                if not more:
                    out += b"0\r\n\r\n"
            else:
                out += body
        if out:
            self._owner.write(out)
        if not more:
            self.complete = True
            self._owner.response_complete(self._sent_status)
            return
        await self._owner.drained()

    def write_more(self, body: bytes) -> bool:
        """Write one more body part of a started response now (``more_body``), unless
        the client is gone or reads slower than we write: then False, nothing written."""
        if self._status or not self.started or self.complete or self.disconnected:
            return False
        if self._owner.writing_paused:
            return False
        if not self._head_only:
            self._owner.write(b"%x\r\n%s\r\n" % (len(body), body) if self._chunked else body)
        return True

    def _status_sent(self) -> None:
        if self._status:
            self._sent_status, self._status = self._status, 0

    def _head(self, length: int, more: bool) -> bytes:
        """The head, with ``content-length`` or chunked framing when the app gave none
        (on HTTP/1.0, which has no chunked framing, the body runs to the close)."""
        declared = any(name == b"content-length" for name, _ in self._headers)
        lines = b"".join(b"%s: %s\r\n" % pair for pair in self._headers)
        framing = b""
        connection = self._connection
        if not declared:
            if more and self._http10:
                connection = _CLOSE
                self._owner.close_after_response()
            elif more:
                self._chunked = True
                framing = b"transfer-encoding: chunked\r\n"
            else:
                framing = b"content-length: %d\r\n" % length
        return b"%s%s%s%s%s\r\n" % (
            status_line(self._status),
            lines,
            framing,
            date_line(),
            connection,
        )

    async def run(self, app: Callable[..., Any]) -> None:
        """Run the app on this request; a failure before the response started is a
        500, one after it a closed connection."""
        try:
            await app(self.scope, self.receive, self.send)
        except Exception:
            logger.exception("the app failed on %s %s", self.scope["method"], self.scope["path"])
            self._fail()
        except asyncio.CancelledError:
            if not self.disconnected:
                self._fail()
            raise
        else:
            if not self.complete:
                self._fail()

    def _fail(self) -> None:
        if self.complete or self.disconnected:
            return
        if self.started:
            self._owner.abort()
            return
        self.started = self.complete = True
        self._owner.write(
            head(500, b"text/plain; charset=utf-8", len(_INTERNAL_ERROR), (), self._connection)
            + (b"" if self._head_only else _INTERNAL_ERROR)
        )
        self._owner.response_complete(500)
