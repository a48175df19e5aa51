"""A connection's transport, phase and state, its one timer for every read deadline,
and how it writes and closes (:class:`ConnectionBase`; see :mod:`.connection`).

One timer per connection serves every request: it is moved only to an earlier
time, and re-armed when it fires before a deadline that moved later.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from ..clock import Timer
from ..http.codecs import JSON, Codec
from ..http.predict import Checked, Predictor
from ..http.stream_route import NativeStreamRoute
from ..timing import Timing, failure_line
from .asgi_cycle import AsgiCycle
from .chunked import ChunkedEnd
from .limits import BODY, CLOSED, HEAD, ConnectionOwner
from .responses import REQUEST_TIMEOUT, Refusal

__all__ = ["ConnectionBase"]


class _LoopClock:
    """The event loop's own clock and timers (what a connection uses by default)."""

    __slots__ = ("call_at", "now")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = loop.time
        self.call_at = loop.call_at


class ConnectionBase(asyncio.Protocol):
    """The state of one client connection and what every part of it uses: writing,
    closing, pausing reads, and the read deadlines.

    Args:
        front: What the server's connections share.
    """

    def __init__(self, front: ConnectionOwner) -> None:
        self._front = front
        self._limits = front.limits
        self._loop = asyncio.get_running_loop()
        self._clock = front.clock if front.clock is not None else _LoopClock(self._loop)
        self._transport: asyncio.Transport | None = None
        self._phase = HEAD
        self._buffer = b""  # bytes received, not yet given to the parser
        self._scanned = 0  # bytes of the buffer already searched for the blank line
        self._processing = False
        self._reading_paused = False
        self._held_for_app = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # the one timer
        self._timer: Timer | None = None
        self._timer_at = math.inf
        self._due = math.inf
        self._head_since = 0.0
        # the first deadline of a request's headers: the idle limit, if sooner
        self._head_wait_s = min(self._limits.header_timeout_s, self._limits.keep_alive_s)
        # the request being read or answered
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []  # as they came (the ASGI scope's)
        self._named: dict[bytes, bytes] = {}  # by name, the last value of each
        self._remaining = 0  # body bytes still to feed; -1: chunked
        self._chunked: ChunkedEnd | None = None
        self._continue = False
        self._keep_alive = True
        self._message_done = False
        self._responded = False
        self._http10 = False
        self._body: list[bytes] = []
        self._body_size = 0
        self._predictor: Predictor | None = None
        self._checked: Checked | None = None
        self._stream_route: NativeStreamRoute | None = None  # the request asks for a stream
        self._stream_checked: object | None = None  # what its route's check gave
        self._started = 0.0
        self._request_id = ""
        self._client = "-"
        self._sockname: Any = None  # the transport's addresses, once connected
        self._peername: Any = None
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Future[Any] | None = None  # a queued item's result
        self._encoder: Codec = JSON
        self._timing: Timing | None = None
        self._cycle: AsgiCycle | None = None
        self._ignore_parser = False

    @property
    def _started_asgi(self) -> bool:
        cycle = self._cycle
        return cycle is not None and cycle.started

    @property
    def writing_paused(self) -> bool:
        """The client reads slower than we write (its transport is over high water)."""
        return self._write_paused

    def write(self, data: bytes) -> None:
        """Send bytes to the client (nothing once closed)."""
        self._write(data)

    def _write(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and self._phase != CLOSED and not transport.is_closing():
            transport.write(data)

    async def drained(self) -> None:
        """Until the transport's buffer is below its high-water mark."""
        if self._write_paused and self._phase != CLOSED:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def _read_by(self, due: float) -> None:
        """Set the read deadline. The one timer is moved only to an earlier time; when
        it fires before the deadline (which moved later meanwhile), it is armed again."""
        self._due = due
        if due < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = due
            self._timer = self._clock.call_at(due, self._on_timer)

    def _stop_timer(self) -> None:
        self._due = math.inf
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        phase = self._phase
        now = self._clock.now()
        if phase == HEAD:
            limits = self._limits
            header_due = self._head_since + limits.header_timeout_s
            idle_due = self._head_since + limits.keep_alive_s
            quiet = not self._buffer and idle_due < header_due
            due = idle_due if quiet else header_due
            if now < due:
                self._read_by(due)
            elif quiet:
                self._close()  # idle: a kept-alive connection expires quietly
            else:
                self._refuse(REQUEST_TIMEOUT)
            return
        due = self._due
        if due == math.inf:
            return
        if now < due:
            self._read_by(due)
        elif phase == BODY and self._held_for_app:
            self._read_by(now + self._limits.body_timeout_s)  # the app reads slowly, not the client
        elif phase == BODY and (self._responded or self._started_asgi):
            self._close()  # the response went out before the body was read: just close
        elif phase == BODY:
            self._refuse(REQUEST_TIMEOUT)

    def _refuse(self, refusal: Refusal) -> None:
        """Answer with a fixed reply and close (no request may follow)."""
        self._write(refusal.reply(self._refusal_timing(refusal)))
        self._close()

    def _refusal_timing(self, refusal: Refusal) -> bytes:
        """A refusal's ``server-timing`` line (when the server tells it): the error
        and the time since the request's headers were awaited (or, with its body
        being read, since they came)."""
        if not self._limits.server_timing:
            return b""
        if self._phase == BODY:
            elapsed = time.monotonic() - self._started
        else:
            elapsed = max(self._clock.now() - self._head_since, 0.0)
        return failure_line(None, elapsed, 0.0, refusal.error)

    def _close(self) -> None:
        if self._phase != CLOSED:
            self._phase = CLOSED
            self._buffer = b""
            self._stop_timer()
            transport = self._transport
            if transport is not None:
                transport.close()

    def _pause_reading(self) -> None:
        transport = self._transport
        if not self._reading_paused and transport is not None and not transport.is_closing():
            self._reading_paused = True
            transport.pause_reading()

    def _resume_reading(self) -> None:
        transport = self._transport
        if self._reading_paused and not self._held_for_app and transport is not None:
            self._reading_paused = False
            if not transport.is_closing():
                transport.resume_reading()
