"""One thread of its own for a model, called from the event loop one call at a
time: the call goes over a queue, its answer comes back as one callback in the
loop.

A step of a step model is such a call, hundreds of times a second, so the hand-over
is kept lean: ``loop.run_in_executor`` makes a concurrent future per call, takes a
few locks and chains the concurrent future to an asyncio one (about twice the
event loop's time per call, measured in ``benchmarks/results/streaming_generative.md``);
here the caller's asyncio future is set by the thread's one ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ModelThread"]

T = TypeVar("T")


class ModelThread:
    """Runs calls in one thread, in the order they come.

    The thread is a daemon: a service left unclosed does not keep the interpreter
    alive; :meth:`close` stops it after the calls already queued.

    Args:
        name: The thread's name.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False

    def call(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``function(*args)`` for the thread; its result (or error) comes on
        the future returned, in the calling event loop.

        Raises:
            RuntimeError: The thread was closed (on the future, not here).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._closed:
            future.set_exception(RuntimeError("the model's thread is closed"))
            return future
        if not self._thread.is_alive():
            self._thread.start()
        self._calls.put(_Call(loop, future, function, args))
        return future

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
        while True:
            call = self._calls.get()
            if call is None:
                return
            try:
                result = call.function(*call.args)
            except BaseException as error:  # it goes to the caller, whatever it is
                call.answer(_fail, error)
            else:
                call.answer(_succeed, result)


class _Call:
    """One queued call and where its answer goes."""

    __slots__ = ("args", "function", "future", "loop")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        function: Callable[..., Any],
        args: tuple[Any, ...],
    ) -> None:
        self.loop = loop
        self.future = future
        self.function = function
        self.args = args

    def answer(self, settle: Callable[[asyncio.Future[Any], Any], None], value: Any) -> None:
        """Settle the future with ``value`` in its loop (unless the loop closed)."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits now
            self.loop.call_soon_threadsafe(settle, self.future, value)


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
