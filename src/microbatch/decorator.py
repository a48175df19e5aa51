"""``@microbatch.batch``: a function over a list becomes a function over one item.

An ``async def`` function becomes a coroutine function awaited once per item; a
plain function becomes a blocking per-item call for threads, and ``acall`` for
asyncio callers, both in one queue (the batch runs in a thread, never in the loop).
Both are :class:`~microbatch.types.Servable`: the HTTP app, the ``--workers`` hub
and Ray replicas serve them as they serve a Service.
"""

from __future__ import annotations

import asyncio
import functools
import math
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypedDict, TypeVar, overload
from weakref import WeakKeyDictionary

from ._hints import item_types
from .batcher import Batcher
from .config import BatchConfig
from .cooperative import CooperativeBatcher
from .execution import is_async_callable
from .policy import QueueState
from .stats import BatcherStats, ServiceStats, StageStats, StatsRecorder
from .timing import Timing
from .types import Route

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .config import PolicySpec
    from .merge import RowFormat

__all__ = ["AsyncBatchedFunction", "BatchSettings", "SyncBatchedFunction", "batch"]

S = TypeVar("S")  # the instance, for methods
T = TypeVar("T")
R = TypeVar("R")

_NO_ROUTES: Mapping[str, Route] = MappingProxyType({})


class BatchSettings(TypedDict, total=False):
    """Keyword settings of :func:`batch`: those of :class:`~microbatch.config.BatchConfig`,
    and ``examples`` (items for warm-up, OpenAPI and ``microbatch bench``)."""

    max_batch_size: int
    max_latency_ms: float
    policy: PolicySpec
    max_queue: int
    max_concurrent_batches: int
    timeout_s: float | None
    size_fn: Callable[[Any], int] | None
    isolate_errors: bool
    cost_fn: Callable[[Any], float] | None
    max_batch_cost: float | None
    batch_cost: Literal["padded", "sum"]
    group_by_cost: bool
    group_window: int
    max_wait_ms: float | None
    split_on_oom: bool
    oom_errors: tuple[type[BaseException], ...]
    examples: Sequence[Any]


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


class _Served:
    """What both batched functions share: binding to instances (``@batch`` on a
    method: each instance gets its own batched function, its own batchers and its
    own policy), and the declared parts of the Servable contract."""

    __wrapped__: Callable[..., Any]
    config: BatchConfig
    _attribute: str | None = None

    def _serve(self, source: Callable[..., Any], examples: Sequence[Any]) -> None:
        self._source = source  # the function as written (unbound), for its hints
        self._examples = tuple(examples)
        self._started = False
        self._closing = False

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        bound = type(self)(  # type: ignore[call-arg]
            functools.partial(self.__wrapped__, instance),
            self.config,
            examples=self._examples,
            source=self._source,
        )
        if self._attribute is not None and hasattr(instance, "__dict__"):
            instance.__dict__[self._attribute] = bound
        return bound

    @property
    def name(self) -> str:
        """The function's name."""
        return getattr(self._source, "__name__", "model")

    @property
    def input_type(self) -> Any:
        """The declared type of one item (``T`` of ``list[T]``), or ``Any``."""
        return item_types(self._source)[0]

    @property
    def output_type(self) -> Any:
        """The declared type of one result, or ``Any``."""
        return item_types(self._source)[1]

    @property
    def routes(self) -> Mapping[str, Route]:
        """None: a function is one entry point."""
        return _NO_ROUTES

    @property
    def examples(self) -> Sequence[Any]:
        """The ``examples=`` given to ``@batch``."""
        return self._examples

    @property
    def ready(self) -> bool:
        """Started and not closing."""
        return self._started and not self._closing

    async def start(self) -> None:
        """Nothing to start (batchers are made on first use): mark it ready."""
        self._started = True
        self._closing = False

    def _service_stats(self, batching: BatcherStats) -> ServiceStats:
        slots = self.config.max_concurrent_batches
        stage = StageStats(self.name, slots, slots, 0, batching)
        in_flight = batching.queued + batching.in_flight
        return ServiceStats(self.ready, self._closing, in_flight, (stage,))


def _final(deadline: float | None) -> float | None:
    """``timeout_s`` for a Servable submit: its deadline, when given, is final (the
    front door worked it out); without one, the function's ``timeout_s`` applies."""
    return None if deadline is None else math.inf


def _no_route(route: str | None) -> None:
    if route is not None:
        raise KeyError(f"no route {route!r}: a batched function has none")


class AsyncBatchedFunction(_Served, Generic[T, R]):
    """An ``async`` batch function, called with one item: ``await fn(item)``.

    Each event loop gets its own :class:`~microbatch.batcher.Batcher` on first use.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Awaitable[Sequence[R]]],
        config: BatchConfig,
        *,
        examples: Sequence[Any] = (),
        source: Callable[..., Any] | None = None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.config = config
        self._serve(fn if source is None else source, examples)
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

    async def submit(
        self,
        item: T,
        *,
        deadline: float | None = None,
        route: str | None = None,
        timing: Timing | None = None,
    ) -> R:
        """The Servable entry: one item, its result; ``deadline`` is final, and a
        function has no routes (KeyError). ``timing`` gets the batch's entry."""
        _no_route(route)
        batcher = self._batchers.current()
        return await batcher.submit(
            item, timeout_s=_final(deadline), deadline=deadline, timing=timing
        )

    @property
    def batcher(self) -> Batcher[T, R]:
        """The :class:`~microbatch.batcher.Batcher` of the running event loop."""
        return self._batchers.current()

    def stats(self) -> ServiceStats:
        """One stage: the counters of the batcher used last (empty before the first
        call) in ``stages[0].batching``."""
        last = self._batchers.last
        batching = last.stats() if last is not None else StatsRecorder().snapshot(QueueState())
        return self._service_stats(batching)

    async def close(self) -> None:
        """Close the running loop's batcher, running what is queued (a later call
        starts a new one)."""
        self._closing = True
        await self._batchers.close()


class SyncBatchedFunction(_Served, Generic[T, R]):
    """A plain batch function, called with one item from any number of threads.

    ``fn(item)`` blocks the calling thread (one of the callers runs each batch);
    ``await fn.acall(item)`` serves asyncio callers, in the same queue: threads and
    asyncio callers batch together, under one ``max_concurrent_batches`` limit and
    one set of counters.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        config: BatchConfig,
        *,
        examples: Sequence[Any] = (),
        source: Callable[..., Any] | None = None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.config = config
        self._serve(fn if source is None else source, examples)
        self._fn = fn
        self._batcher: CooperativeBatcher[T, R] = CooperativeBatcher(fn, config)

    def __call__(
        self, item: T, /, *, timeout_s: float | None = None, deadline: float | None = None
    ) -> R:
        """Submit one item and block for its result; see :meth:`CooperativeBatcher.submit`."""
        return self._batcher.submit(item, timeout_s=timeout_s, deadline=deadline)

    async def acall(
        self, item: T, /, *, timeout_s: float | None = None, deadline: float | None = None
    ) -> R:
        """Submit one item from asyncio code; the batch runs off the event loop."""
        return await self._batcher.asubmit(item, timeout_s=timeout_s, deadline=deadline)

    async def submit(
        self,
        item: T,
        *,
        deadline: float | None = None,
        route: str | None = None,
        timing: Timing | None = None,
    ) -> R:
        """The Servable entry: :meth:`acall` with a final ``deadline``; no routes;
        ``timing`` gets the batch's entry."""
        _no_route(route)
        return await self._batcher.asubmit(
            item, timeout_s=_final(deadline), deadline=deadline, timing=timing
        )

    @property
    def batcher(self) -> CooperativeBatcher[T, R]:
        """The one :class:`~microbatch.cooperative.CooperativeBatcher` of threads and
        ``acall``."""
        return self._batcher

    threads = batcher
    loop_batcher = batcher  # before thread and asyncio callers shared one batcher

    def stats(self) -> ServiceStats:
        """One stage: the counters of every caller, threads and ``acall``, in
        ``stages[0].batching``."""
        return self._service_stats(self._batcher.stats())

    def close(self) -> Awaitable[None]:
        """Refuse new items, run the queued ones, and return when none is left; a
        later call starts afresh with a new batcher.

        From a thread (no running event loop) it blocks until done. In an event loop,
        ``await fn.close()``: the wait happens in a thread, the loop keeps serving.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._close_now()
            return _Done()
        return self.aclose()

    async def aclose(self) -> None:
        """:meth:`close` from asyncio code."""
        await asyncio.to_thread(self._close_now)

    def _close_now(self) -> None:
        self._closing = True
        closing = self._batcher
        closing.close()
        if self._batcher is closing:
            self._batcher = CooperativeBatcher(self._fn, self.config)


class _Done:
    """An awaitable that is done already (a close that finished before returning)."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


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
    examples = settings.pop("examples", ())
    config = BatchConfig(**settings)

    def wrap(function: Callable[..., Any]) -> Any:
        if is_async_callable(function):
            return AsyncBatchedFunction(function, config, examples=examples)
        return SyncBatchedFunction(function, config, examples=examples)

    return wrap if fn is None else wrap(fn)
