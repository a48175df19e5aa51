"""The asyncio batcher: callers await one item each; batches run in a free slot.

There is no dispatcher loop. The batcher reacts to events (an arrival, a finished
batch, a policy timer, a deadline): each asks the policy whether the queued items go
now, and a batch is released only into a free slot (``max_concurrent_batches``).
While every slot is busy the queue keeps filling, so batches grow under load.

Every batch goes one way: to a :class:`~microbatch.types.BatchRunner` (worker
processes, threads, or the user's function wrapped in an in-process runner), which
reports when the batch really started and ended; the policy learns from that.

This module is the callers' side (submitting, admission, cancellation, deadlines,
closing); queueing one item and letting it go is its base class's
(``_queueing.py``), releasing batches and settling them that one's base's
(``_release.py``); the queued entries are ``_entries.py``'s.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from ._deadlines import DeadlineWatch
from ._entries import Entry as _Entry
from ._inprocess import FunctionRunner, function_runner
from ._intake import Intake, Part
from ._queueing import BatchQueueing
from .clock import Clock, MonotonicClock, Timer
from .config import BatchConfig
from .errors import BatcherClosed
from .execution import settle
from .policy import Policy
from .stats import BatcherStats
from .timing import Timing
from .types import BatchDone, BatchJob, BatchRunner, BeginsBatches

__all__ = ["Batcher", "BeginsBatches"]

T = TypeVar("T")
R = TypeVar("R")

BatchFunction = (
    Callable[[list[Any]], Awaitable[Sequence[Any]]] | Callable[[list[Any]], Sequence[Any]]
)


class Batcher(BatchQueueing, Generic[T, R]):
    """Gathers items submitted by asyncio callers into batches.

    Give it either a batch function or a runner. ``fn`` takes a list of items and
    returns a sequence of results of the same length (an exception instance at
    position ``i`` fails only item ``i``); an ``async def`` function is awaited in
    the loop, a plain one runs in a thread pool (one thread per slot) so the loop
    never blocks. A ``runner`` (:class:`~microbatch.types.BatchRunner`) runs batches
    elsewhere, such as worker processes: it gets ``BatchJob(items, deadlines,
    wanted, units)``, leaves out the items nobody waits for any more, and reports
    when the model really started and finished, which the policy's cost model learns
    from. With ``rows``, the items a runner gets are the callers' parts (each a
    sequence of rows): the runner merges them (a function is wrapped in one that does).

    A batcher belongs to the event loop of its first :meth:`submit`.

    Args:
        fn: The batch function (or give ``runner``).
        config: Batching settings; or pass them as keyword arguments.
        runner: What runs the batches (or give ``fn``).
        clock: Time source (a FakeClock in tests).
        run_ahead: Whether a batch may be handed over while every slot is busy, to
            wait there for a running one (at most one per slot; the policy says
            when: a full batch at once, otherwise when that beats waiting for the
            running batch's callers to come back). Default: True for a runner and a
            plain function (whose thread pool queues it), False for an async ``fn``.
        **settings: Fields of :class:`~microbatch.config.BatchConfig`.

    Raises:
        TypeError: Both or neither of ``fn`` and ``runner``; both ``config`` and settings.
    """

    def __init__(
        self,
        fn: BatchFunction | None = None,
        config: BatchConfig | None = None,
        *,
        runner: BatchRunner | None = None,
        clock: Clock | None = None,
        run_ahead: bool | None = None,
        **settings: Any,
    ) -> None:
        if config is not None and settings:
            raise TypeError("pass either config or keyword settings, not both")
        if (fn is None) == (runner is None):
            raise TypeError("give either a batch function or a runner")
        self.config = config if config is not None else BatchConfig(**settings)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._now = self._clock.now
        if isinstance(self._clock, MonotonicClock):
            self._now = time.monotonic
        self._intake: Intake[_Entry] = Intake(self.config, self._now)
        self._own_runner: FunctionRunner | None = None
        if runner is None:
            assert fn is not None
            runner = self._own_runner = function_runner(
                fn,
                isolate_errors=self.config.isolate_errors,
                rows=self._intake.rows,
                size_of=_size_of(self._intake),
                now=self._now,
                threads=self.config.max_concurrent_batches,
                memory=self._intake.memory_splits,
            )
            ahead = self._own_runner.queues_batches
        else:
            ahead = True
        self._runner: BatchRunner = runner
        # A runner that can start a batch without a task (see BeginsBatches).
        self._begin: Callable[[BatchJob, Callable[[BatchDone], None]], None] | None = (
            runner.begin if isinstance(runner, BeginsBatches) else None
        )
        self._run_ahead = ahead if run_ahead is None else run_ahead
        self._queue = self._intake.queue
        self._state = self._intake.state
        self._stats = self._intake.stats
        self._policy = self._intake.policy
        self._slots = self.config.max_concurrent_batches
        # Batches handed to the runner and not done, oldest first: id -> units.
        self._handed: dict[int, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._all_done: asyncio.Event | None = None  # made by close() to wait on
        self._timer: Timer | None = None
        self._timer_at = 0.0
        self._dispatch_soon = False  # a dispatch for this round's arrivals is scheduled
        self._deadlines: DeadlineWatch = DeadlineWatch(self._clock, self._expire)
        self._loop_ref: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._max_queue = self.config.max_queue
        self.name: str = getattr(fn, "__name__", "") if fn is not None else ""
        """Recorded in a :class:`~microbatch.timing.Timing` (when its stage is unset)."""

    @property
    def policy(self) -> Policy:
        """This batcher's own policy (a fresh one, made from ``config.policy``)."""
        return self._policy

    # -- calling -----------------------------------------------------------------

    async def submit(
        self,
        item: T,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
        timing: Timing | None = None,
    ) -> R:
        """Queue one item and wait for its own result.

        Args:
            item: The item (with ``rows``: a sequence of rows).
            timeout_s: Give up after this many seconds (default: ``config.timeout_s``).
            deadline: Give up at this ``time.monotonic()`` time.
            timing: A record to append this batch's timing to (queued, behind a
                running batch, model time, batch size), when the item's batch ran.

        Raises:
            Overloaded: The queue is full; nothing was queued.
            DeadlineExceeded: The deadline passed first.
            BatcherClosed: The batcher is closing.
            ItemTooLarge: One item is bigger than ``max_batch_size`` (without rows).
            Exception: Whatever the batch function raised or returned for this item.
        """
        intake = self._intake
        if intake.plain and timeout_s is None:
            # The hot path: one item whose deadline (if any) the caller worked out.
            entry = self._enqueue_plain(item, deadline)
        else:
            due = intake.deadline(timeout_s, deadline)  # the one place it is worked out
            parts = intake.parts(item)
            if len(parts) > 1:
                return await self._submit_parts(parts, due, timing)  # type: ignore[no-any-return]
            loop = self._bind()
            intake.admit(1, due)
            part = parts[0]
            entry = self._enqueue(loop, part.item, part.units, due, part)
        entry.timing = timing
        try:
            return await entry.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self._abandon(entry)
            raise

    @property
    def accepts_nowait(self) -> bool:
        """Whether :meth:`submit_nowait` may be called: items are one unit each (no
        rows, ``size_fn`` or ``cost_fn``) and have no default timeout."""
        return self._intake.plain

    def submit_nowait(
        self,
        item: T,
        *,
        deadline: float | None = None,
        timing: Timing | None = None,
        on_settled: Callable[[], None] | None = None,
    ) -> asyncio.Future[R]:
        """:meth:`submit` without a coroutine, for a caller on the event loop that
        would otherwise make a task per item: queue the item now and return the
        future of its result. Cancelling the future withdraws the item.
        ``on_settled()`` is called once the future is done (from the batcher's own
        callback of the future: one callback per item, not two).

        Raises:
            TypeError: The batcher does not accept it (see :attr:`accepts_nowait`).
            Overloaded, DeadlineExceeded, BatcherClosed: As :meth:`submit` (nothing
                was queued).
        """
        if not self._intake.plain:
            raise TypeError("submit_nowait() needs items without rows, size_fn, cost_fn or timeout")
        return self.queue_nowait(item, deadline, timing, on_settled)

    def stats(self) -> BatcherStats:
        """A snapshot of the counters (see :class:`~microbatch.stats.BatcherStats`)."""
        return self._stats.snapshot(self._state)

    async def close(self, *, drain: bool = True) -> None:
        """Stop taking items and settle every pending one; every concurrent call
        returns once the last batch is done.

        Args:
            drain: Run the queued items now (True), or answer them BatcherClosed.
        """
        self._intake.closing = True
        if not drain:
            for entry in list(self._queue):
                self._drop(entry)
                settle(entry.future, BatcherClosed("the batcher closed before this item ran"))
        if self._loop_ref is not None and self._loop_ref() is asyncio.get_running_loop():
            self._dispatch()
        if self._handed:
            if self._all_done is None:  # a second close() waits on the same event
                self._all_done = asyncio.Event()
            await self._all_done.wait()
        if self._own_runner is not None:
            self._own_runner.close()
        self._deadlines.close()

    async def __aenter__(self) -> Batcher[T, R]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def _submit_parts(
        self, parts: list[Part], deadline: float | None, timing: Timing | None
    ) -> Any:
        loop = self._bind()
        self._intake.admit(len(parts), deadline)
        entries = [self._enqueue(loop, part.item, part.units, deadline, part) for part in parts]
        entries[0].timing = timing  # the first part's batch speaks for the item
        try:
            outcomes = await asyncio.gather(
                *(entry.future for entry in entries), return_exceptions=True
            )
        except BaseException:
            for entry in entries:
                entry.future.cancel()
                self._abandon(entry)
            raise
        return self._intake.result(outcomes)


def _size_of(intake: Intake[Any]) -> Callable[[Any], int]:
    """The units of one queued part, as the intake counted them."""
    rows, size_fn = intake.rows, intake.config.size_fn
    if rows is not None:
        return lambda part: max(rows.count(part), 1)
    if size_fn is not None:
        return size_fn
    return lambda _: 1
