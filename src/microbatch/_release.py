"""When the asyncio batcher's queued items go, and how their batch comes back: the
release half of :class:`~microbatch.batcher.Batcher` (its base class; the batcher
adds the callers' side: submitting, admission, cancellation, deadlines, closing).

A batch is released only into a free slot (``max_concurrent_batches``), or handed
over to wait for a running one (run-ahead), once the policy says go (now, or at a
timer); it goes to the :class:`~microbatch.types.BatchRunner` as a ``BatchJob``, as
a task awaiting ``run`` or without one through the runner's ``begin``. When it comes
back, the policy learns its duration, each waiting caller's future gets its outcome,
timed requests get the batch's timing, and the slot is freed for the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

from mypy_extensions import mypyc_attr

from ._batch_timing import record_batch
from ._entries import Entry as _Entry
from ._entries import wanted
from ._intake import Intake
from ._queue import PendingQueue
from ._queue_state import QueueState
from .clock import Clock, Timer
from .config import BatchConfig
from .errors import DeadlineExceeded, MicrobatchError
from .execution import settle
from .policy import Policy
from .stats import StatsRecorder
from .timing import Timing
from .types import BatchDone, BatchJob, BatchRunner

__all__ = ["BatchRelease"]


@mypyc_attr(allow_interpreted_subclasses=True)  # the Batcher extends it
class BatchRelease:
    """Releases queued batches to the runner and settles them when they are done:
    the base of :class:`~microbatch.batcher.Batcher`, whose ``__init__`` sets every
    attribute declared here.

    Its methods call each other as ``BatchRelease._name(self, ...)``, and hand
    themselves out as ``BatchRelease._name`` with ``self`` as an argument: compiled,
    that is a direct call, where ``self._name`` on an instance of the interpreted
    Batcher is a Python attribute lookup and call (about 20 times slower)."""

    config: BatchConfig
    name: str
    _clock: Clock
    _now: Callable[[], float]
    _intake: Intake[_Entry]
    _queue: PendingQueue[_Entry]
    _state: QueueState
    _stats: StatsRecorder
    _policy: Policy
    _runner: BatchRunner
    _begin: Callable[[BatchJob, Callable[[BatchDone], None]], None] | None
    _run_ahead: bool
    _slots: int
    _handed: dict[int, int]  # batches handed to the runner and not done: id -> units
    _tasks: set[asyncio.Task[None]]
    _all_done: asyncio.Event | None
    _timer: Timer | None
    _timer_at: float
    _dispatch_soon: bool

    def _dispatch_at_round_end(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._dispatch_soon:
            self._dispatch_soon = True
            loop.call_soon(BatchRelease._dispatch_arrivals, self)

    def _dispatch_arrivals(self) -> None:
        self._dispatch_soon = False
        BatchRelease._dispatch(self)

    def _may_release(self) -> bool:
        """A slot is free, or a batch may be handed over to wait for a running one
        (at most one per slot: the runner then starts it the moment one finishes,
        which keeps a saturated model busy back to back)."""
        handed = len(self._handed)
        return handed < self._slots or (self._run_ahead and handed < 2 * self._slots)

    def _dispatch(self, now: float | None = None) -> None:
        """Release batches while a slot is free and the policy says go."""
        queue, state = self._queue, self._state
        while state.count and BatchRelease._may_release(self):
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
                    BatchRelease._wake_at(self, at)
                    return
            BatchRelease._release(self, now)
            now = None

    def _wake_at(self, at: float) -> None:
        if self._timer is not None:
            if self._timer_at <= at:
                return  # an earlier wake-up will ask the policy again
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._clock.call_at(at, partial(BatchRelease._on_timer, self))

    def _on_timer(self) -> None:
        self._timer = None
        BatchRelease._dispatch(self, self._timer_at)

    def _release(self, now: float) -> None:
        # A policy may cap this batch below max_batch_size (AdaptivePolicy.batch_limit).
        batch, units = self._queue.take(now, getattr(self._policy, "batch_limit", None))
        self._handed[id(batch)] = units
        if self._begin is not None:
            # The runner sends the batch now and reports back from the loop: no task.
            job = BatchRelease._job(self, batch, units)
            self._begin(job, partial(BatchRelease._ran, self, batch, now))
            return
        task = asyncio.get_running_loop().create_task(self._run(batch, units, now))
        self._tasks.add(task)  # the loop keeps only a weak reference to tasks
        task.add_done_callback(self._tasks.discard)

    def _job(self, batch: list[_Entry], units: int) -> BatchJob:
        """The job a runner gets for ``batch`` (each entry learns its place in it)."""
        job = BatchJob(
            [entry.item for entry in batch],
            [entry.deadline for entry in batch],
            partial(wanted, batch),
            units,
        )
        for index, entry in enumerate(batch):
            entry.job, entry.index = job, index
        return job

    async def _run(self, batch: list[_Entry], units: int, released: float) -> None:
        """Hand one batch to the runner and settle every future in it."""
        job = BatchRelease._job(self, batch, units)
        try:
            done = await self._runner.run(job)
        except BaseException as exc:
            BatchRelease._abort(self, batch, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            BatchRelease._settle_batch(self, batch, done, released)
        finally:
            BatchRelease._batch_done(self, batch)

    def _ran(self, batch: list[_Entry], released: float, done: BatchDone) -> None:
        """A batch handed over with the runner's ``begin`` is done: settle every
        future in it."""
        try:
            BatchRelease._settle_batch(self, batch, done, released)
        except Exception as exc:
            BatchRelease._abort(self, batch, exc)
            raise
        finally:
            # The runner reports as it reads the result, maybe before the requests
            # read in the same round: the next batch waits for them (the callers
            # are answered now all the same).
            BatchRelease._batch_done(self, batch, at_round_end=True)

    def _settle_batch(self, batch: list[_Entry], done: BatchDone, released: float) -> None:
        started, finished = done.started_s, done.finished_s
        duration = None
        if started is not None and finished is not None and done.units > 0:
            duration = finished - started
            self._policy.batch_finished(done.units, duration)
        self._intake.finished(batch, done.out_of_memory, duration)
        outcomes = done.outcomes
        if len(outcomes) != len(batch):
            BatchRelease._abort(
                self, batch, MicrobatchError(f"{len(outcomes)} outcomes for {len(batch)}")
            )
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
            BatchRelease._record_timings(self, timed, batch, done, released)

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
            BatchRelease._dispatch_at_round_end(self, asyncio.get_running_loop())
        else:
            BatchRelease._dispatch(self)
        if not self._handed and self._all_done is not None:
            self._all_done.set()
