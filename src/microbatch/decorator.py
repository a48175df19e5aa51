"""``@microbatch.batch``: a function over a list becomes a function over one item.

An ``async def`` function becomes a coroutine function awaited once per item; a
plain function becomes a blocking per-item call for threads (and ``acall`` for
asyncio callers, which runs the batch in a worker thread).
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypedDict, TypeVar, overload
from weakref import WeakKeyDictionary

from .batcher import Batcher
from .config import BatchConfig
from .cooperative import CooperativeBatcher
from .execution import is_async_callable
from .policy import QueueState
from .stats import BatcherStats, StatsRecorder

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .merge import RowFormat
    from .policy import Policy

__all__ = ["AsyncBatchedFunction", "BatchSettings", "SyncBatchedFunction", "batch"]

S = TypeVar("S")  # the instance, for methods
T = TypeVar("T")
R = TypeVar("R")


class BatchSettings(TypedDict, total=False):
    """Keyword settings of :func:`batch`; see :class:`~microbatch.config.BatchConfig`."""

    max_batch_size: int
    max_latency_ms: float
    policy: Literal["adaptive", "fixed"] | Policy
    max_queue: int
    max_concurrent_batches: int
    timeout_s: float | None
    size_fn: Callable[[Any], int] | None
    isolate_errors: bool


class _LoopBatchers(Generic[T, R]):
    """One asyncio Batcher per event loop, made on first use in that loop."""

    def __init__(self, fn: Callable[[list[Any]], Any], config: BatchConfig) -> None:
        self._fn = fn
        self._config = config
        self._by_loop: WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher[T, R]] = (
            WeakKeyDictionary()
        )
        self.last: Batcher[T, R] | None = None
        self._last_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def current(self) -> Batcher[T, R]:
        loop = asyncio.get_running_loop()
        if self._last_loop is not None and self._last_loop() is loop:
            return self.last  # type: ignore[return-value]
        batcher = self._by_loop.get(loop)
        if batcher is None:
            batcher = self._by_loop[loop] = Batcher(self._fn, self._config)
        self.last, self._last_loop = batcher, weakref.ref(loop)
        return batcher

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        batcher = self._by_loop.pop(loop, None)
        if self._last_loop is not None and self._last_loop() is loop:
            self._last_loop = None
        if batcher is not None:
            await batcher.close()


class _BindsToInstances:
    """Makes a batched function work as a method: each instance gets its own batcher.

    ``@batch`` on a method binds the method to the instance on first access and keeps
    the bound batched function on the instance, so every instance batches its own
    calls (and its own model) separately.
    """

    __wrapped__: Callable[..., Any]
    config: BatchConfig
    _attribute: str | None = None

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        bound = type(self)(functools.partial(self.__wrapped__, instance), self.config)  # type: ignore[call-arg]
        if self._attribute is not None and hasattr(instance, "__dict__"):
            instance.__dict__[self._attribute] = bound
        return bound


class AsyncBatchedFunction(_BindsToInstances, Generic[T, R]):
    """An ``async`` batch function, called with one item: ``await fn(item)``."""

    def __init__(
        self, fn: Callable[[list[T]], Awaitable[Sequence[R]]], config: BatchConfig
    ) -> None:
        functools.update_wrapper(self, fn)
        self.config = config
        self._batchers: _LoopBatchers[T, R] = _LoopBatchers(fn, config)

    def __call__(
        self, item: T, /, *, timeout_s: float | None = None, deadline: float | None = None
    ) -> Coroutine[Any, Any, R]:
        """Submit one item and await its result; see :meth:`Batcher.submit`."""
        try:
            batcher = self._batchers.current()
        except RuntimeError:  # no running loop yet, as in asyncio.run(fn(item))
            return self._submit_later(item, timeout_s, deadline)
        return batcher.submit(item, timeout_s=timeout_s, deadline=deadline)

    async def _submit_later(self, item: T, timeout_s: float | None, deadline: float | None) -> R:
        return await self._batchers.current().submit(item, timeout_s=timeout_s, deadline=deadline)

    @property
    def batcher(self) -> Batcher[T, R]:
        """The :class:`~microbatch.batcher.Batcher` of the running event loop."""
        return self._batchers.current()

    def stats(self) -> BatcherStats:
        """Counters of the batcher used last (empty before the first call)."""
        last = self._batchers.last
        return last.stats() if last is not None else StatsRecorder().snapshot(QueueState())

    async def close(self) -> None:
        """Close the running loop's batcher, running what is queued."""
        await self._batchers.close()


class SyncBatchedFunction(_BindsToInstances, Generic[T, R]):
    """A plain batch function, called with one item from any number of threads.

    ``fn(item)`` blocks the calling thread (one of the callers runs each batch);
    ``await fn.acall(item)`` serves asyncio callers and runs batches in a thread.
    Threads and asyncio callers are batched separately, each path keeping its own
    ``max_concurrent_batches`` limit.
    """

    def __init__(self, fn: Callable[[list[T]], Sequence[R]], config: BatchConfig) -> None:
        functools.update_wrapper(self, fn)
        self.config = config
        self.threads: CooperativeBatcher[T, R] = CooperativeBatcher(fn, config)
        self._batchers: _LoopBatchers[T, R] = _LoopBatchers(fn, config)

    def __call__(
        self, item: T, /, *, timeout_s: float | None = None, deadline: float | None = None
    ) -> R:
        """Submit one item and block for its result; see :meth:`CooperativeBatcher.submit`."""
        return self.threads.submit(item, timeout_s=timeout_s, deadline=deadline)

    async def acall(
        self, item: T, /, *, timeout_s: float | None = None, deadline: float | None = None
    ) -> R:
        """Submit one item from asyncio code; the batch runs off the event loop."""
        return await self._batchers.current().submit(item, timeout_s=timeout_s, deadline=deadline)

    @property
    def loop_batcher(self) -> Batcher[T, R]:
        """The :class:`~microbatch.batcher.Batcher` serving ``acall`` in the running loop."""
        return self._batchers.current()

    def stats(self) -> BatcherStats:
        """Counters of the thread path (``loop_batcher.stats()`` for ``acall``)."""
        return self.threads.stats()

    def close(self) -> None:
        """Close the thread path, running what is queued."""
        self.threads.close()

    async def aclose(self) -> None:
        """Close the running loop's ``acall`` batcher, running what is queued."""
        await self._batchers.close()


class BatchDecorator(Protocol):
    """What ``batch(...)`` with settings returns."""

    @overload
    def __call__(
        self, fn: Callable[[S, list[T]], Awaitable[Sequence[R]]], /
    ) -> Callable[[S, T], Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(self, fn: Callable[[S, list[T]], Sequence[R]], /) -> Callable[[S, T], R]: ...
    @overload
    def __call__(
        self, fn: Callable[[list[T]], Awaitable[Sequence[R]]], /
    ) -> AsyncBatchedFunction[T, R]: ...
    @overload
    def __call__(self, fn: Callable[[list[T]], Sequence[R]], /) -> SyncBatchedFunction[T, R]: ...


class RowsDecorator(Protocol):
    """What ``batch(rows=...)`` returns: items are sequences of rows."""

    @overload
    def __call__(
        self, fn: Callable[[Any], Awaitable[Any]], /
    ) -> AsyncBatchedFunction[Any, Any]: ...
    @overload
    def __call__(self, fn: Callable[[Any], Any], /) -> SyncBatchedFunction[Any, Any]: ...
    @overload
    def __call__(self, fn: Callable[[Any, Any], Any], /) -> Any: ...


@overload
def batch(
    fn: Callable[[S, list[T]], Awaitable[Sequence[R]]], /
) -> Callable[[S, T], Coroutine[Any, Any, R]]: ...
@overload
def batch(fn: Callable[[S, list[T]], Sequence[R]], /) -> Callable[[S, T], R]: ...
@overload
def batch(fn: Callable[[list[T]], Awaitable[Sequence[R]]], /) -> AsyncBatchedFunction[T, R]: ...
@overload
def batch(fn: Callable[[list[T]], Sequence[R]], /) -> SyncBatchedFunction[T, R]: ...
@overload
def batch(*, rows: None = None, **settings: Unpack[BatchSettings]) -> BatchDecorator: ...
@overload
def batch(
    *, rows: Literal["list", "numpy"] | RowFormat, **settings: Unpack[BatchSettings]
) -> RowsDecorator: ...
def batch(fn: Callable[..., Any] | None = None, /, **settings: Any) -> Any:
    """Turn a function over a list of items into a function over one item.

    ``fn`` takes ``list[T]`` and returns a list of ``R`` of the same length; an
    exception instance at position ``i`` fails only item ``i``. Use it bare
    (``@batch``) or with settings (``@batch(max_batch_size=64, max_latency_ms=10)``);
    the settings are those of :class:`~microbatch.config.BatchConfig`.

    Returns:
        :class:`AsyncBatchedFunction` for an ``async def`` function (``await f(x)``),
        :class:`SyncBatchedFunction` for a plain one (``f(x)`` from threads,
        ``await f.acall(x)`` from asyncio). On a method (``def f(self, xs)``), each
        instance gets its own batched function on first access.

    Raises:
        ValueError: A setting is out of range.
    """
    config = BatchConfig(**settings)

    def wrap(function: Callable[..., Any]) -> Any:
        if is_async_callable(function):
            return AsyncBatchedFunction(function, config)
        return SyncBatchedFunction(function, config)

    return wrap if fn is None else wrap(fn)
