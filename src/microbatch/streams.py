"""One caller's stream of chunks: what the step loop pushes into, and what the
caller iterates (``async for``, or a plain iterator from another thread).

A stream ends exactly once: complete, with its own error, or because its caller
left (stopped iterating, was cancelled, or the stream was garbage-collected). Its
deadlines (one for the first chunk, one for the whole stream) end it with
:class:`~microbatch.errors.DeadlineExceeded`, set by one timer on the clock; the
step loop drops a stream that ended from the next step.

A stream holds at most ``max_buffered`` chunks its caller has not read: a caller
that reads more slowly than the model makes chunks (an HTTP client on a slow link)
would otherwise make the server buffer without bound. The stream is then ended with
:class:`SlowReader`: its caller still reads the chunks that came, then the error,
and its item leaves at the next step (its place goes to a caller that reads). Ending
it, rather than pausing the item, keeps every step over every active item (a paused
item would still hold its place and its state, for as long as the reader dawdles).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from ._channel import MAX_BUFFERED_CHUNKS, Channel, Stream
from ._compiled_docs import restore_docstring
from .errors import SlowReader

__all__ = [
    "MAX_BUFFERED_CHUNKS",
    "Channel",
    "SlowReader",
    "Stream",
    "iterate_from_thread",
    "stop_reading",
]

T = TypeVar("T")

_OPEN: Any = object()  # what _next gives at the end of a stream
_CLOSE_WAIT_S = 5.0  # a thread waits this long for its stream to be left on the loop

restore_docstring(Channel)
restore_docstring(Stream)


async def stop_reading(chunks: AsyncIterator[Any]) -> None:
    """Stop reading ``chunks``: close it where it can be closed (a stream of a
    :class:`~microbatch.Service`, or one wrapping it, then frees its slot at the
    next step); any other async iterator is left as it is."""
    closing = getattr(chunks, "aclose", None)
    if closing is not None:
        await closing()


def iterate_from_thread(
    open_stream: Callable[[], AsyncIterator[T]], loop: asyncio.AbstractEventLoop
) -> Iterator[T]:
    """The chunks of a stream opened on ``loop`` (running in another thread), as a
    plain iterator for the calling thread. Closing the iterator (or leaving a
    ``for`` loop over it, or dropping it) leaves the stream.

    Args:
        open_stream: Opens the stream; called on ``loop``.
        loop: The running event loop the service lives on (not this thread's).
    """

    async def opened() -> AsyncIterator[T]:
        return open_stream()

    stream = _wait(asyncio.run_coroutine_threadsafe(opened(), loop))
    try:
        while True:
            chunk = _wait(asyncio.run_coroutine_threadsafe(_next(stream), loop))
            if chunk is _OPEN:
                return
            yield chunk
    finally:
        # Left on the loop, and waited for: the stream must have ended before this
        # thread drops it (a Stream dropped while open leaves from whichever thread
        # drops it, which must be the loop's).
        closing = getattr(stream, "aclose", None)
        if closing is not None and not loop.is_closed():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(closing(), loop).result(_CLOSE_WAIT_S)


async def _next(stream: AsyncIterator[T]) -> T:
    """The next chunk, or ``_OPEN`` once the stream is over (a coroutine must not
    raise StopAsyncIteration through a future)."""
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return _OPEN  # type: ignore[no-any-return]


def _wait(future: concurrent.futures.Future[T]) -> T:
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
