"""One thread of its own for a model, called from the event loop one call at a
time: the call goes over a queue, its answer comes back as one callback in the
loop.

A step of a step model is such a call, hundreds of times a second, so the hand-over
is kept lean: ``loop.run_in_executor`` makes a concurrent future per call, takes a
few locks and chains the concurrent future to an asyncio one (about twice the
event loop's time per call, measured in ``benchmarks/results/streaming_generative.md``);
here the caller's asyncio future is set by the thread's one ``call_soon_threadsafe``.

A call to an idle thread may also hand it the GIL, so that the call starts at once
rather than when the event loop's thread next blocks: whether it does is learned
from the calls' round trips (:mod:`microbatch.pipeline.gil_handoff`).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from .gil_handoff import GilHandoff

__all__ = ["ModelThread"]

# The longest the event loop's thread waits for an idle model thread to take a call.
_HANDOFF_WAIT_S = 0.001

T = TypeVar("T")


class ModelThread:
    """Runs calls in one thread, in the order they come.

    The thread is a daemon: a service left unclosed does not keep the interpreter
    alive; :meth:`close` stops it after the calls already queued.

    Args:
        name: The thread's name.
        clock: Seconds, for the calls' round trips.

    Attributes:
        handoff: Whether :meth:`call_now` hands the GIL over (learned).
    """

    def __init__(self, name: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False
        self._idle = False  # the thread waits for a call, none queued
        self._clock = clock
        self.handoff = GilHandoff()

    def call(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``function(*args)`` for the thread; its result (or error) comes on
        the future returned, in the calling event loop.

        Raises:
            RuntimeError: The thread was closed (on the future, not here).
        """
        loop = asyncio.get_running_loop()
        if self._closed:
            future: asyncio.Future[T] = loop.create_future()
            future.set_exception(RuntimeError("the model's thread is closed"))
            return future
        if not self._thread.is_alive():
            self._thread.start()
        call = _Call(loop, function, args)
        self._idle = False
        self._calls.put(call)
        return call.future

    def call_now(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """:meth:`call`, for the calls that should start at once (a model's steps):
        an idle thread may be handed the GIL with it (:attr:`handoff` learns whether
        that pays; other calls would skew what it learns)."""
        if self._closed or not self._idle:  # closed, or this call waits its turn anyway
            return self.call(function, *args)
        call = _Call(asyncio.get_running_loop(), function, args)
        handed = self.handoff.choose()
        call.on_answer = partial(self._answered, handed, self._clock())
        self._idle = False
        if handed:
            call.taken = taken = threading.Lock()
            taken.acquire()
            self._calls.put(call)
            taken.acquire(timeout=_HANDOFF_WAIT_S)  # the GIL is free while it waits
        else:
            self._calls.put(call)
        return call.future

    def _answered(self, handed: bool, put_s: float) -> None:
        """A call of :meth:`call_now` put at ``put_s`` is answered in the loop now."""
        self.handoff.observe(handed, self._clock() - put_s)

    async def close(self) -> None:
        """Stop the thread once the calls queued before are done, and wait for it."""
        if self._closed:
            return
        self._closed = True
        if not self._thread.is_alive():
            return
        self._calls.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def _serve(self) -> None:
        calls = self._calls
        while True:
            self._idle = calls.empty()
            call = calls.get()
            self._idle = False
            if call is None:
                return
            if call.taken is not None:
                call.taken.release()
            try:
                result = call.function(*call.args)
            except BaseException as error:  # it goes to the caller, whatever it is
                call.answer(_fail, error)
            else:
                call.answer(_succeed, result)


class _Call:
    """One queued call and where its answer goes."""

    __slots__ = ("args", "function", "future", "loop", "on_answer", "taken")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, function: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.function = function
        self.args = args
        self.taken: threading.Lock | None = None  # released by the thread as it takes the call
        self.on_answer: Callable[[], None] | None = None  # called in the loop, first

    def answer(self, settle: Callable[[asyncio.Future[Any], Any], None], value: Any) -> None:
        """Settle the future with ``value`` in its loop (unless the loop closed)."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits now
            if self.on_answer is None:
                self.loop.call_soon_threadsafe(settle, self.future, value)
            else:
                self.loop.call_soon_threadsafe(self._told, settle, value)

    def _told(self, settle: Callable[[asyncio.Future[Any], Any], None], value: Any) -> None:
        assert self.on_answer is not None
        self.on_answer()
        settle(self.future, value)


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
