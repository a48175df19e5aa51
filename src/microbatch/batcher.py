"""The asyncio batcher: callers await one item each; batches run in a free slot.

There is no dispatcher loop. The batcher reacts to events (an arrival, a finished
batch, a policy timer, a deadline): each asks the policy whether the queued items go
now, and a batch is released only into a free slot (``max_concurrent_batches``).
While every slot is busy the queue keeps filling, so batches grow under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from types import TracebackType
from typing import Any, Generic, TypeVar

from .clock import Clock, MonotonicClock, Timer
from .config import BatchConfig
from .errors import BatcherClosed, DeadlineExceeded, ItemTooLarge, MicrobatchError, Overloaded
from .execution import is_async_callable, run_batch, run_batch_async, settle
from .merge import merged, merged_async, row_format, split_rows
from .pending import Pending, PendingQueue
from .policy import make_policy
from .stats import BatcherStats

__all__ = ["Batcher"]

T = TypeVar("T")
R = TypeVar("R")

BatchFunction = (
    Callable[[list[Any]], Awaitable[Sequence[Any]]] | Callable[[list[Any]], Sequence[Any]]
)


class _Entry(Pending):
    """One queued item, its deadline and the future its caller awaits."""

    __slots__ = ("deadline", "future", "item", "timer")

    def __init__(
        self,
        item: Any,
        size: int,
        arrival: float,
        future: asyncio.Future[Any],
        deadline: float | None,
    ) -> None:
        super().__init__(size, arrival)
        self.item = item
        self.future = future
        self.deadline = deadline
        self.timer: Timer | None = None


class Batcher(Generic[T, R]):
    """Gathers items submitted by asyncio callers into batches for ``fn``.

    ``fn`` takes a list of items and returns a list of results of the same length
    (an exception instance at position ``i`` fails only item ``i``). It may be an
    ``async def`` function, or a plain function, which then runs in a thread so the
    event loop never blocks.

    A batcher belongs to the event loop of its first :meth:`submit`.

    Args:
        fn: The batch function.
        config: Batching settings; or pass them as keyword arguments.
        clock: Time source (a FakeClock in tests).
        run_ahead: Whether a batch may be handed to ``fn`` while every slot is busy,
            to wait there for a running one (at most one per slot; the policy says
            when: a full batch at once, otherwise when that beats waiting for the
            running batch's callers to come back). Default: for plain functions,
            whose thread pool queues it; set it for an async ``fn`` that queues it
            itself, like a worker pool.
        pass_deadlines: Call ``fn(items, deadlines)``, with each item's deadline
            (a ``time.monotonic()`` time, or None), for a function that may start a
            batch later than it gets it (a worker pool holding it behind a running
            batch) and should leave out the items that expired meanwhile. Not with
            ``rows``.
        **settings: Fields of :class:`~microbatch.config.BatchConfig`.
    """

    def __init__(
        self,
        fn: BatchFunction,
        config: BatchConfig | None = None,
        *,
        clock: Clock | None = None,
        run_ahead: bool | None = None,
        pass_deadlines: bool = False,
        **settings: Any,
    ) -> None:
        self.config = config if config is not None else BatchConfig(**settings)
        if config is not None and settings:
            raise TypeError("pass either config or keyword settings, not both")
        if pass_deadlines and self.config.rows is not None:
            raise ValueError("pass_deadlines does not work with rows")
        self._pass_deadlines = pass_deadlines
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._rows = row_format(self.config)
        self._is_async = is_async_callable(fn)
        self._run_ahead = not self._is_async if run_ahead is None else run_ahead
        if self._rows is not None:
            fn = merged_async(fn, self._rows) if self._is_async else merged(fn, self._rows)  # type: ignore[arg-type]
        self._fn = fn
        self._policy = make_policy(self.config)
        self._queue: PendingQueue[_Entry] = PendingQueue(self.config.max_batch_size)
        self._state = self._queue.state
        self._stats = self._queue.stats
        self._free_slots = self.config.max_concurrent_batches
        # Batches holding a slot, by id: (when they started, units); and batches
        # handed over behind them, in order: (id, units). A policy sees when the
        # running batch started, to hand the next one over just before it ends.
        self._running: dict[int, tuple[float, int]] = {}
        self._ahead: deque[tuple[int, int]] = deque()
        self._batches_running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._all_done: asyncio.Event | None = None  # made by close() to wait on
        self._timer: Timer | None = None
        self._timer_at = 0.0
        self._closing = False
        self._loop_ref: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._executor: ThreadPoolExecutor | None = None
        # Hot-path copies: one item without deadline, size or rows needs no more.
        self._plain = self._rows is None and self.config.size_fn is None
        self._max_queue = self.config.max_queue
        self._now = time.monotonic if isinstance(self._clock, MonotonicClock) else self._clock.now

    # -- calling -----------------------------------------------------------------

    async def submit(
        self, item: T, *, timeout_s: float | None = None, deadline: float | None = None
    ) -> R:
        """Queue one item and wait for its own result.

        Args:
            item: The item (with ``rows``: a sequence of rows).
            timeout_s: Give up after this many seconds (default: ``config.timeout_s``).
            deadline: Give up at this ``time.monotonic()`` time.

        Raises:
            Overloaded: The queue is full; nothing was queued.
            DeadlineExceeded: The deadline passed first.
            BatcherClosed: The batcher is closing.
            ItemTooLarge: One item is bigger than ``max_batch_size`` (without rows).
            Exception: Whatever the batch function raised or returned for this item.
        """
        if self._plain and timeout_s is None and deadline is None and not self.config.timeout_s:
            entry = self._enqueue(item, 1, None)  # the hot path: nothing to work out
        elif self._rows is not None:
            return await self._submit_rows(item, self._deadline(timeout_s, deadline))  # type: ignore[no-any-return]
        else:
            size_fn = self.config.size_fn
            size = 1 if size_fn is None else _checked_size(size_fn(item), self.config)
            entry = self._enqueue(item, size, self._deadline(timeout_s, deadline))
        try:
            return await entry.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self._abandon(entry)
            raise

    def stats(self) -> BatcherStats:
        """A snapshot of the counters (see :class:`~microbatch.stats.BatcherStats`)."""
        return self._stats.snapshot(self._state)

    async def close(self, *, drain: bool = True) -> None:
        """Stop taking items and settle every pending one.

        Args:
            drain: Run the queued items now (True), or answer them BatcherClosed.
        """
        self._closing = True
        if not drain:
            for entry in list(self._queue):
                self._drop(entry)
                settle(entry.future, BatcherClosed("the batcher closed before this item ran"))
        if self._loop_ref is not None and self._loop_ref() is asyncio.get_running_loop():
            self._dispatch()
        if self._batches_running:
            self._all_done = asyncio.Event()
            await self._all_done.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> Batcher[T, R]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # -- intake ------------------------------------------------------------------

    def _deadline(self, timeout_s: float | None, deadline: float | None) -> float | None:
        if timeout_s is None:
            timeout_s = self.config.timeout_s
        if timeout_s is None:
            return deadline
        due = self._now() + timeout_s
        return due if deadline is None else min(due, deadline)

    def _enqueue(self, item: Any, size: int, deadline: float | None) -> _Entry:
        loop = asyncio.get_running_loop()
        if self._loop_ref is None or self._loop_ref() is not loop:
            self._bind(loop)
        if self._closing:
            raise BatcherClosed("the batcher is closed")
        state = self._state
        if state.count >= self._max_queue:
            self._stats.rejected += 1
            raise Overloaded(f"the queue is full ({state.count} items waiting)")
        now = self._now()
        if deadline is not None and deadline <= now:
            self._stats.expired += 1
            raise DeadlineExceeded("the deadline passed before the item was queued")
        entry = _Entry(item, size, now, loop.create_future(), deadline)
        if deadline is not None:
            entry.timer = self._clock.call_at(deadline, partial(self._expire, entry))
        self._queue.add(entry, now)
        if self._free_slots or self._may_run_ahead():
            self._dispatch()
        return entry

    async def _submit_rows(self, item: Any, deadline: float | None) -> Any:
        assert self._rows is not None
        parts = split_rows(self._rows, item, self.config.max_batch_size)
        room = self.config.max_queue - self._state.count
        if len(parts) > room:
            self._stats.rejected += 1
            raise Overloaded(f"the queue has room for {room} parts, the item needs {len(parts)}")
        entries = [self._enqueue(part, size, deadline) for part, size in parts]
        try:
            if len(entries) == 1:
                return await entries[0].future
            results = await asyncio.gather(*(entry.future for entry in entries))
        except BaseException:
            for entry in entries:
                entry.future.cancel()
                self._abandon(entry)
            raise
        return self._rows.join(results)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Belong to ``loop``: the first loop to submit, or any once that one is gone."""
        if self._loop_ref is not None and self._loop_ref() is not None:
            raise RuntimeError("this Batcher belongs to another event loop; make one per loop")
        self._loop_ref = weakref.ref(loop)

    def _abandon(self, entry: _Entry) -> None:
        """The caller stopped waiting."""
        if entry.queued:
            self._stats.cancelled += 1
            self._drop(entry)
        elif entry.timer is not None:
            entry.timer.cancel()

    def _expire(self, entry: _Entry) -> None:
        entry.timer = None
        if entry.future.done():
            return
        self._stats.expired += 1
        if entry.queued:
            self._drop(entry)
        entry.future.set_exception(
            DeadlineExceeded("the deadline passed before the result was ready")
        )

    def _drop(self, entry: _Entry) -> None:
        """Take a queued entry out of the queue: it will not run."""
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        self._queue.drop(entry)

    # -- dispatch ----------------------------------------------------------------

    def _dispatch(self, now: float | None = None) -> None:
        """Release batches while a slot is free and the policy says go."""
        queue, state = self._queue, self._state
        while state.count and (self._free_slots or self._may_run_ahead()):
            queue.head()
            clock_now = self._now()
            now = clock_now if now is None or clock_now > now else now
            if not self._closing:
                state.behind = not self._free_slots
                if state.behind:
                    state.running_since_s, state.running_size = min(self._running.values())
                at = self._policy.release_at(state, now)
                if at > now:
                    self._wake_at(at)
                    return
            self._release(now)
            now = None

    def _may_run_ahead(self) -> bool:
        """Whether a batch may be handed over to wait for a running one.

        A thread (or worker) that finishes a batch then starts the next at once,
        instead of waiting for the event loop (and the GIL) to hand it over: this
        keeps a saturated model busy back to back.
        """
        return self._run_ahead and len(self._ahead) < self.config.max_concurrent_batches

    def _wake_at(self, at: float) -> None:
        if self._timer is not None:
            if self._timer_at <= at:
                return  # an earlier wake-up will ask the policy again
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._clock.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch(self._timer_at)

    def _release(self, now: float) -> None:
        batch, units = self._queue.take(now)
        if self._free_slots:
            self._free_slots -= 1
            self._running[id(batch)] = (now, units)
        else:
            self._ahead.append((id(batch), units))
        loop = asyncio.get_running_loop()
        self._batches_running += 1
        if self._is_async:
            task = loop.create_task(self._run(batch))
            self._tasks.add(task)  # the loop keeps only a weak reference to tasks
            task.add_done_callback(self._tasks.discard)
            return
        # No task in between: the pool thread starts now and hands the outcomes
        # straight back to the loop, which settles the batch.
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self.config.max_concurrent_batches, thread_name_prefix="microbatch"
            )
        self._executor.submit(self._run_in_thread, batch, loop)

    async def _run(self, batch: list[_Entry]) -> None:
        """Run one batch of an async function and settle every future in it."""
        try:
            live, outcomes, duration = await self._execute_async(batch)
            self._settle_batch(live, outcomes, duration)
        except BaseException as exc:
            self._abort(batch, exc)
            raise
        finally:
            self._batch_done(batch)

    def _run_in_thread(self, batch: list[_Entry], loop: asyncio.AbstractEventLoop) -> None:
        """Runs in a pool thread: run the batch, then settle it in the loop."""
        try:
            result: tuple[list[_Entry], list[Any], float] | BaseException = self._execute_in_thread(
                batch
            )
        except BaseException as exc:  # handed to the loop, which fails the batch
            result = exc
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(self._ran_in_thread, batch, result)

    def _ran_in_thread(
        self, batch: list[_Entry], result: tuple[list[_Entry], list[Any], float] | BaseException
    ) -> None:
        """Settle a batch that ran in the pool (in the loop)."""
        try:
            if isinstance(result, BaseException):
                self._abort(batch, result)
            else:
                self._settle_batch(*result)
        finally:
            self._batch_done(batch)

    def _settle_batch(self, live: list[_Entry], outcomes: list[Any], duration_s: float) -> None:
        if live:
            self._policy.batch_finished(sum(entry.size for entry in live), duration_s)
        for entry, outcome in zip(live, outcomes, strict=True):
            future = entry.future
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                self._stats.failed += 1
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _abort(self, batch: list[_Entry], error: BaseException) -> None:
        for entry in batch:
            settle(entry.future, MicrobatchError(f"the batch was aborted: {error!r}"))

    def _batch_done(self, batch: list[_Entry]) -> None:
        """Free the batch's slot, whatever happened to it, and release what is next."""
        for entry in batch:
            if entry.timer is not None:
                entry.timer.cancel()
        now = self._now()
        self._state.finished(len(batch), now)
        key = id(batch)
        if self._running.pop(key, None) is None:  # it finished before taking a slot
            self._ahead.remove(next(ahead for ahead in self._ahead if ahead[0] == key))
        elif self._ahead:  # a batch waiting in the pool took the slot
            next_key, units = self._ahead.popleft()
            self._running[next_key] = (now, units)
        else:
            self._free_slots += 1
        self._batches_running -= 1
        self._dispatch()
        if not self._batches_running and self._all_done is not None:
            self._all_done.set()

    async def _execute_async(self, batch: list[_Entry]) -> tuple[list[_Entry], list[Any], float]:
        live = [entry for entry in batch if not entry.future.done()]
        if not live:
            return live, [], 0.0
        fn: Callable[[list[Any]], Awaitable[Sequence[Any]]] = self._fn  # type: ignore[assignment]
        items: list[Any] = [entry.item for entry in live]
        if self._pass_deadlines:
            fn, items = partial(_with_deadlines, self._fn, live), list(range(len(live)))
        start = self._now()
        outcomes = await run_batch_async(fn, items, self.config.isolate_errors, _wanted(live))
        # A batch handed over behind a running one started when that one finished.
        return live, outcomes, self._now() - max(start, self._state.last_finish_s)

    def _execute_in_thread(self, batch: list[_Entry]) -> tuple[list[_Entry], list[Any], float]:
        """Runs in a pool thread. Items answered meanwhile (deadline, cancelled) are skipped."""
        live = [entry for entry in batch if not entry.future.done()]
        if not live:
            return live, [], 0.0
        fn: Callable[[list[Any]], Sequence[Any]] = self._fn  # type: ignore[assignment]
        items: list[Any] = [entry.item for entry in live]
        if self._pass_deadlines:
            fn, items = partial(_with_deadlines, self._fn, live), list(range(len(live)))
        start = self._now()
        outcomes = run_batch(fn, items, self.config.isolate_errors, _wanted(live))
        return live, outcomes, self._now() - start


def _with_deadlines(fn: Callable[..., Any], live: list[_Entry], indexes: list[int]) -> Any:
    """Call ``fn`` on the entries at ``indexes`` (a whole batch, or one part of it
    while a failure is bisected) with their deadlines."""
    entries = [live[index] for index in indexes]
    return fn([entry.item for entry in entries], [entry.deadline for entry in entries])


def _wanted(live: list[_Entry]) -> Callable[[int], bool]:
    return lambda index: not live[index].future.done()


def _checked_size(size: int, config: BatchConfig) -> int:
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size_fn must return an int >= 1, got {size!r}")
    if size > config.max_batch_size:
        raise ItemTooLarge(f"item of size {size} exceeds max_batch_size={config.max_batch_size}")
    return size
