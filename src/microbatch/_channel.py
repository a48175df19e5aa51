"""The two sides of one stream: :class:`Channel`, what the step loop pushes chunks
and the end into (once per item per step), and :class:`Stream`, what its caller
reads. Their own module so that the wheel compiles them; :mod:`microbatch.streams`
re-exports them with the ways to read a stream."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from .clock import Clock, Timer
from .errors import DeadlineExceeded, SlowReader

__all__ = ["MAX_BUFFERED_CHUNKS", "Channel", "Stream"]

_OPEN: Any = object()  # the end of a stream that has not ended

MAX_BUFFERED_CHUNKS = 4096
"""Chunks a stream holds unread, by default, before it ends with :class:`SlowReader`."""


class Channel:
    """The producer's side of one stream: the step loop pushes chunks and the end
    here; the caller reads them through the :class:`Stream` that wraps it.

    The step loop holds the channel, never the Stream, so a caller that drops its
    Stream leaves (its slot is freed at the next step).

    Args:
        key: The item's key in its step loop.
        item: The item.
        deadline: ``time.monotonic()`` time by which the whole stream must end.
        first_chunk_deadline: Time by which the first chunk must come.
        clock: Reads the time and sets the deadline timer.
        on_end: Called once when the stream ends, however it ends.
        max_buffered: Most chunks held unread; one more ends the stream with
            :class:`SlowReader` (None: no limit).
    """

    def __init__(
        self,
        key: int,
        item: Any,
        *,
        deadline: float | None,
        first_chunk_deadline: float | None,
        clock: Clock,
        on_end: Callable[[Channel], None] | None = None,
        max_buffered: int | None = MAX_BUFFERED_CHUNKS,
    ) -> None:
        if max_buffered is not None and max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1 or None, got {max_buffered!r}")
        self.key = key
        self.max_buffered = max_buffered
        self.item = item
        self.deadline = deadline
        self.first_chunk_deadline = first_chunk_deadline
        self.opened_s = clock.now()
        self.ended = False
        """It has ended (complete, failed, expired, or its caller left): a plain
        attribute, read at every step for every active stream."""
        self.chunks_sent = 0
        self.last_chunk_s: float | None = None
        self._clock = clock
        self._on_end = on_end
        self.chunks: deque[Any] = deque()
        self._end: Any = _OPEN  # None: complete; an exception: failed
        self._left = False
        self._raised = False
        self._waiter: asyncio.Future[None] | None = None
        self._on_chunk: Callable[[], None] | None = None
        self._timer: Timer | None = None
        self._arm()

    @property
    def left(self) -> bool:
        """Its caller stopped reading before it ended."""
        return self._left

    @property
    def error(self) -> BaseException | None:
        """Its error, once it failed."""
        return self._end if isinstance(self._end, BaseException) else None

    def push(self, chunk: Any, now: float | None = None) -> None:
        """Append one chunk (ignored once the stream ended); with ``max_buffered``
        chunks unread already, end the stream with :class:`SlowReader` instead.

        Args:
            chunk: The chunk.
            now: The time it came (the step loop reads the clock once per step for
                every stream it hands a chunk); None: read the clock.
        """
        if self.ended:
            return
        chunks = self.chunks
        most = self.max_buffered
        if most is not None and len(chunks) >= most:
            self.finish(SlowReader.after(len(chunks)))
            return
        self.last_chunk_s = self._clock.now() if now is None else now
        chunks.append(chunk)
        sent = self.chunks_sent = self.chunks_sent + 1
        if sent == 1 and self.first_chunk_deadline is not None:
            self._arm()  # the first chunk's deadline is met: the whole stream's is next
        if self._on_chunk is not None:
            self._on_chunk()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_chunk(self, callback: Callable[[], None] | None) -> None:
        """While set, a chunk that comes is queued and ``callback()`` is called,
        instead of waking the reader (the end still wakes it); None: wake it again."""
        self._on_chunk = callback

    def take_ready(self) -> list[Any]:
        """The chunks that came and are not read yet, taken without waiting."""
        ready = list(self.chunks)
        self.chunks.clear()
        return ready

    def unread(self, chunks: list[Any]) -> None:
        """Put ``chunks`` (taken from :attr:`chunks`, in order) back at the head, and
        wake the reader."""
        if self._left:
            return
        self.chunks.extendleft(reversed(chunks))
        self._wake()

    def finish(self, error: BaseException | None = None) -> None:
        """End the stream: complete (``error`` None) or with ``error``. Only the
        first end counts."""
        if self.ended:
            return
        self._end = error
        self._ended()
        self._wake()

    def leave(self) -> None:
        """The caller stops reading: drop it at the next step; a read waiting for
        its next chunk ends (StopAsyncIteration), and the chunks not read are gone."""
        if self.ended:
            return
        self._left = True
        self.chunks.clear()
        self._ended()
        self._wake()

    async def next_chunk(self, holder: object = None) -> Any:
        """The next chunk; StopAsyncIteration at the end, or the stream's error (once).

        Args:
            holder: Kept alive until the chunk comes (the :class:`Stream` read).
        """
        while not self.chunks:
            if self._left:
                raise StopAsyncIteration
            if self._end is not _OPEN:
                if self._end is None or self._raised:
                    raise StopAsyncIteration
                self._raised = True  # raised once; then the stream is over
                raise self._end
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                self.leave()
                raise
            finally:
                self._waiter = None
        return self.chunks.popleft()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _ended(self) -> None:
        self.ended = True
        self._on_chunk = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._on_end is not None:
            on_end, self._on_end = self._on_end, None
            on_end(self)

    def _arm(self) -> None:
        """One timer for the nearest deadline still to meet."""
        due = self.deadline
        if self.chunks_sent == 0 and self.first_chunk_deadline is not None:
            due = self.first_chunk_deadline if due is None else min(due, self.first_chunk_deadline)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due is not None:
            self._timer = self._clock.call_at(due, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self.ended:
            return
        if self.chunks_sent == 0:
            self.finish(DeadlineExceeded("no chunk came before the stream's deadline"))
        else:
            self.finish(DeadlineExceeded("the stream did not end before its deadline"))


class Stream:
    """The chunks of one item, in order, then its end: what a caller iterates.

    ``async for chunk in stream`` gives the chunks and raises the item's own error
    if it failed. Leaving early (:meth:`aclose`, leaving ``async with stream``, a
    cancelled task, or dropping the stream) frees its slot at the next step. (An
    async iterator by its methods: a compiled class has no ``AsyncIterator`` base.)
    """

    __slots__ = ("_channel",)

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    @property
    def item(self) -> Any:
        """The item."""
        return self._channel.item

    @property
    def chunks_sent(self) -> int:
        """Chunks the model has made for it so far."""
        return self._channel.chunks_sent

    @property
    def ended(self) -> bool:
        """It has ended (complete, failed, expired, or left)."""
        return self._channel.ended

    def __aiter__(self) -> Stream:
        return self

    def __anext__(self) -> Awaitable[Any]:
        # The channel's coroutine, not one wrapping it (once per chunk); it holds
        # this stream, which must not be dropped (and so leave) while it waits.
        return self._channel.next_chunk(self)

    async def aclose(self) -> None:
        """Stop reading: the stream's slot is freed at the next step."""
        self.leave()

    def leave(self) -> None:
        """:meth:`aclose`, from code that cannot wait (a read waiting for the next
        chunk ends: the stream is over for its reader)."""
        self._channel.leave()

    def take_ready(self) -> list[Any]:
        """The chunks that have come and not been read yet, without waiting (a
        writer that fell behind sends them at once; the end, or an error, still
        comes from the next ``__anext__``)."""
        return self._channel.take_ready()

    def on_chunk(self, callback: Callable[[], None] | None) -> None:
        """While set, a chunk that comes waits for :meth:`take_ready` and
        ``callback()`` is called, rather than a reader in ``__anext__`` woken (a
        writer of many streams writes a step's chunks in one go); the end still
        comes from ``__anext__``. None: chunks wake the reader again."""
        self._channel.on_chunk(callback)

    def unread(self, chunks: list[Any]) -> None:
        """Put chunks taken with :meth:`take_ready` back, first, for ``__anext__``
        (a writer that could not write them now hands them back to the reader)."""
        self._channel.unread(chunks)

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._channel.leave()

    def __del__(self) -> None:
        # A caller that dropped its stream without reading it to the end has left.
        self._channel.leave()
