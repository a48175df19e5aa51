"""The asyncio batcher: callers await one item each; batches run in a free slot.

There is no dispatcher loop. The batcher reacts to events (an arrival, a finished
batch, a policy timer, a deadline): each asks the policy whether the queued items go
now, and a batch is released only into a free slot (``max_concurrent_batches``).
While every slot is busy the queue keeps filling, so batches grow under load.

Every batch goes one way: to a :class:`~microbatch.types.BatchRunner` (worker
processes, threads, or the user's function wrapped in an in-process runner), which
reports when the batch really started and ended; the policy learns from that.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ._batch_timing import record_batch
from ._deadlines import DeadlineWatch
from ._inprocess import FunctionRunner, function_runner
from ._intake import Intake, Part
from ._queue import Pending
from .clock import Clock, MonotonicClock, Timer
from .config import BatchConfig
from .errors import BatcherClosed, DeadlineExceeded, MicrobatchError
from .execution import settle
from .policy import Policy
from .stats import BatcherStats
from .timing import Timing
from .types import BatchDone, BatchJob, BatchRunner

__all__ = ["Batcher", "BeginsBatches"]

T = TypeVar("T")
R = TypeVar("R")

BatchFunction = (
    Callable[[list[Any]], Awaitable[Sequence[Any]]] | Callable[[list[Any]], Sequence[Any]]
)


@runtime_checkable
class BeginsBatches(Protocol):
    """A runner that can also hand over a batch without a task: ``begin`` sends it
    now and calls ``on_done`` with the :class:`~microbatch.types.BatchDone` that
    ``run`` would return, once, from the event loop, never from within ``begin``
    (a process pool: the result is reported in the loop round it is read)."""

    def begin(self, job: BatchJob, on_done: Callable[[BatchDone], None]) -> None:
        """Hand ``job`` over; report how it went to ``on_done``."""


class _Entry(Pending):
    """One queued item, its deadline and the future its caller awaits."""

    __slots__ = ("deadline", "future", "index", "item", "job", "timer", "timing")

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
        self.job: BatchJob | None = None  # while its batch is at the runner
        self.index = 0  # its place in that batch
        self.timing: Timing | None = None  # the caller's record, when it wants one

    def unwanted(self) -> None:
        """Tell the runner holding this entry's batch that nobody waits for it."""
        job = self.job
        if job is not None and job.on_unwanted is not None:
            job.on_unwanted(self.index)


class Batcher(Generic[T, R]):
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
        self._deadlines: DeadlineWatch[_Entry] = DeadlineWatch(self._clock, self._expire)
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
        self, item: T, *, deadline: float | None = None, timing: Timing | None = None
    ) -> asyncio.Future[R]:
        """:meth:`submit` without a coroutine, for a caller on the event loop that
        would otherwise make a task per item: queue the item now and return the
        future of its result. Cancelling the future withdraws the item.

        Raises:
            TypeError: The batcher does not accept it (see :attr:`accepts_nowait`).
            Overloaded, DeadlineExceeded, BatcherClosed: As :meth:`submit` (nothing
                was queued).
        """
        if not self._intake.plain:
            raise TypeError("submit_nowait() needs items without rows, size_fn, cost_fn or timeout")
        entry = self._enqueue_plain(item, deadline)
        entry.timing = timing
        entry.future.add_done_callback(partial(self._settled, entry))
        return entry.future

    def _settled(self, entry: _Entry, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self._abandon(entry)

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

    # -- intake ------------------------------------------------------------------

    def _enqueue_plain(self, item: Any, deadline: float | None) -> _Entry:
        """Admit and queue one item of one unit (a plain intake)."""
        loop = self._bind()
        now = self._now()
        if (
            self._intake.closing
            or self._state.count >= self._max_queue
            or (deadline is not None and deadline <= now)
        ):
            self._intake.admit(1, deadline)  # raises BatcherClosed, Overloaded or expired
        return self._enqueue(loop, item, 1, deadline, now=now)

    def _enqueue(
        self,
        loop: asyncio.AbstractEventLoop,
        item: Any,
        size: int,
        deadline: float | None,
        part: Part | None = None,
        now: float | None = None,
    ) -> _Entry:
        """Queue one admitted part (``part`` gives its cost, when one was measured)."""
        if now is None:
            now = self._now()
        entry = _Entry(item, size, now, loop.create_future(), deadline)
        if part is not None:
            part.measure(entry)
        if deadline is not None:
            self._deadlines.watch(entry, deadline)  # one timer for every item's deadline
        self._queue.add(entry, now)
        if self._may_release():
            if self._state.size >= self.config.max_batch_size:
                self._dispatch()
            else:
                # Ask the policy once the loop has taken every request that came in
                # with this one (the same round of I/O), not once per arrival, so the
                # next batch holds the whole round.
                self._dispatch_at_round_end(loop)
        return entry

    def _dispatch_at_round_end(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._dispatch_soon:
            self._dispatch_soon = True
            loop.call_soon(self._dispatch_arrivals)

    def _dispatch_arrivals(self) -> None:
        self._dispatch_soon = False
        self._dispatch()

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

    def _bind(self) -> asyncio.AbstractEventLoop:
        """Belong to the running loop: the first to submit, or any once that one is gone."""
        loop = asyncio.get_running_loop()
        ref = self._loop_ref
        if ref is None or ref() is not loop:
            if ref is not None and ref() is not None:
                raise RuntimeError("this Batcher belongs to another event loop; make one per loop")
            self._loop_ref = weakref.ref(loop)
        return loop

    def _abandon(self, entry: _Entry) -> None:
        """The caller stopped waiting."""
        if entry.queued:
            self._stats.cancelled += 1
            self._drop(entry)
            return
        if entry.timer is not None:
            entry.timer.cancel()
        entry.unwanted()

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
        entry.unwanted()

    def _drop(self, entry: _Entry) -> None:
        """Take a queued entry out of the queue: it will not run."""
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        self._queue.drop(entry)

    # -- dispatch ----------------------------------------------------------------

    def _may_release(self) -> bool:
        """A slot is free, or a batch may be handed over to wait for a running one
        (at most one per slot: the runner then starts it the moment one finishes,
        which keeps a saturated model busy back to back)."""
        handed = len(self._handed)
        return handed < self._slots or (self._run_ahead and handed < 2 * self._slots)

    def _dispatch(self, now: float | None = None) -> None:
        """Release batches while a slot is free and the policy says go."""
        queue, state = self._queue, self._state
        while state.count and self._may_release():
            queue.head()
            clock_now = self._now()
            now = clock_now if now is None or clock_now > now else now
            if not self._intake.closing:
                state.behind = len(self._handed) >= self._slots
                if state.behind:
                    # The runner owns the ledger of running batches; the size is that
                    # of the oldest batch handed over, the one running longest.
                    since = self._runner.running_since()
                    state.running_since_s = now if since is None else since
                    state.running_size = next(iter(self._handed.values()))
                at = self._policy.release_at(state, now)
                if at > now:
                    self._wake_at(at)
                    return
            self._release(now)
            now = None

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
        self._handed[id(batch)] = units
        if self._begin is not None:
            # The runner sends the batch now and reports back from the loop: no task.
            self._begin(self._job(batch, units), partial(self._ran, batch, now))
            return
        task = asyncio.get_running_loop().create_task(self._run(batch, units, now))
        self._tasks.add(task)  # the loop keeps only a weak reference to tasks
        task.add_done_callback(self._tasks.discard)

    def _job(self, batch: list[_Entry], units: int) -> BatchJob:
        """The job a runner gets for ``batch`` (each entry learns its place in it)."""
        job = BatchJob(
            [entry.item for entry in batch],
            [entry.deadline for entry in batch],
            partial(_wanted, batch),
            units,
        )
        for index, entry in enumerate(batch):
            entry.job, entry.index = job, index
        return job

    async def _run(self, batch: list[_Entry], units: int, released: float) -> None:
        """Hand one batch to the runner and settle every future in it."""
        job = self._job(batch, units)
        try:
            done = await self._runner.run(job)
        except BaseException as exc:
            self._abort(batch, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self._settle_batch(batch, done, released)
        finally:
            self._batch_done(batch)

    def _ran(self, batch: list[_Entry], released: float, done: BatchDone) -> None:
        """A batch handed over with the runner's ``begin`` is done: settle every
        future in it."""
        try:
            self._settle_batch(batch, done, released)
        except Exception as exc:
            self._abort(batch, exc)
            raise
        finally:
            # The runner reports as it reads the result, maybe before the requests
            # read in the same round: the next batch waits for them (the callers
            # are answered now all the same).
            self._batch_done(batch, at_round_end=True)

    def _settle_batch(self, batch: list[_Entry], done: BatchDone, released: float) -> None:
        started, finished = done.started_s, done.finished_s
        duration = None
        if started is not None and finished is not None and done.units > 0:
            duration = finished - started
            self._policy.batch_finished(done.units, duration)
        self._intake.finished(batch, done.out_of_memory, duration)
        outcomes = done.outcomes
        if len(outcomes) != len(batch):
            self._abort(batch, MicrobatchError(f"{len(outcomes)} outcomes for {len(batch)}"))
            return
        ran = started is not None and finished is not None  # else nothing to record
        timed: list[tuple[Timing, float]] = []
        for entry, outcome in zip(batch, outcomes, strict=True):
            future = entry.future
            if future.done():
                continue
            if ran and entry.timing is not None:
                timed.append((entry.timing, entry.arrival))
            if isinstance(outcome, BaseException):
                # A runner that left an item out at its deadline (by its own clock,
                # a moment before the batcher's timer) answers it as expired.
                if isinstance(outcome, DeadlineExceeded):
                    self._stats.expired += 1
                else:
                    self._stats.failed += 1
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if timed:  # the futures' callbacks run later: in time to read it
            self._record_timings(timed, batch, done, released)

    def _record_timings(
        self,
        timed: list[tuple[Timing, float]],
        batch: list[_Entry],
        done: BatchDone,
        released: float,
    ) -> None:
        """Append this batch's part to each timed request's record (and trace it)."""
        assert done.started_s is not None and done.finished_s is not None
        cost = sum(entry.cost for entry in batch) if self.config.cost_fn is not None else None
        size = done.units or sum(entry.size for entry in batch)
        record_batch(self.name, timed, released, done.started_s, done.finished_s, size, cost)

    def _abort(self, batch: list[_Entry], error: BaseException) -> None:
        for entry in batch:
            settle(entry.future, MicrobatchError(f"the batch was aborted: {error!r}"))

    def _batch_done(self, batch: list[_Entry], *, at_round_end: bool = False) -> None:
        """Free the batch's slot, whatever happened to it, and release what is next
        (now, or once the loop has taken this round's arrivals)."""
        for entry in batch:
            if entry.timer is not None:
                entry.timer.cancel()
            entry.job = None  # no reference cycle through the job's wanted()
        self._state.finished(len(batch), self._now())
        del self._handed[id(batch)]
        if at_round_end and self._state.count:
            self._dispatch_at_round_end(asyncio.get_running_loop())
        else:
            self._dispatch()
        if not self._handed and self._all_done is not None:
            self._all_done.set()


def _wanted(batch: list[_Entry], index: int) -> bool:
    """Whether item ``index``'s caller still waits (not cancelled, not expired)."""
    return not batch[index].future.done()


def _size_of(intake: Intake[Any]) -> Callable[[Any], int]:
    """The units of one queued part, as the intake counted them."""
    rows, size_fn = intake.rows, intake.config.size_fn
    if rows is not None:
        return lambda part: max(rows.count(part), 1)
    if size_fn is not None:
        return size_fn
    return lambda _: 1
