"""The thread batcher: callers in plain threads block for one item each.

There is no background thread. The caller that owns the oldest queued item is the
*leader*: it waits (on a condition, never a poll) until a slot is free and the
policy says go, takes a batch from the head of the queue, hands the lead to the
owner of the next queued item, runs the batch in its own thread, and settles every
item of it. Followers sleep until their items are settled or the lead comes to
them. Every wait has a way out (its caller's deadline, a settled item, the lead),
and a batch function that calls its own batcher gets an error instead of a deadlock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from .clock import Clock, MonotonicClock
from .config import BatchConfig
from .errors import BatcherClosed, DeadlineExceeded, ItemTooLarge, MicrobatchError, Overloaded
from .execution import run_batch
from .merge import merged, row_format, split_rows
from .pending import Pending, PendingQueue
from .policy import make_policy
from .stats import BatcherStats

__all__ = ["CooperativeBatcher"]

T = TypeVar("T")
R = TypeVar("R")

_PENDING = object()


class _Call:
    """One caller's request: its items (several parts with rows) and its wake-up.

    The wake-up is a lock that stays held; "armed" while the caller waits on it.
    Whoever settles the call or hands it the lead releases it once, under the
    batcher's lock. The caller sleeps on it without holding the batcher's lock, so a
    settled caller returns at once instead of queueing for that lock.
    """

    __slots__ = ("armed", "deadline", "entries", "pending", "signal")

    def __init__(self, deadline: float | None) -> None:
        self.signal = threading.Lock()
        self.signal.acquire()
        self.armed = False
        self.deadline = deadline
        self.entries: list[_Entry] = []
        self.pending = 0

    def wake(self) -> None:
        """Wake the caller (batcher lock held); a no-op unless it is waiting."""
        if self.armed:
            self.armed = False
            self.signal.release()

    def disarm(self, woken: bool) -> None:
        """After a wait (batcher lock held): the signal is held again, not armed."""
        if self.armed:
            self.armed = False  # timed out and nobody woke us: still held
        elif not woken:
            self.signal.acquire()  # woken just after timing out: take it back


class _Entry(Pending):
    __slots__ = ("call", "item", "outcome")

    def __init__(self, call: _Call, item: Any, size: int, arrival: float) -> None:
        super().__init__(size, arrival)
        self.call = call
        self.item = item
        self.outcome: Any = _PENDING


class CooperativeBatcher(Generic[T, R]):
    """Gathers items submitted from many threads into batches for ``fn``.

    ``fn`` takes a list of items and returns a list of results of the same length
    (an exception instance at position ``i`` fails only item ``i``). It runs in the
    thread of one of the callers in the batch; that caller's deadline cannot cut the
    model short in its own thread, so it is answered when the batch returns (every
    other caller is answered at its deadline).

    Args:
        fn: The batch function.
        config: Batching settings; or pass them as keyword arguments.
        clock: Time source for the policy and deadlines (``time.monotonic`` scale).
        **settings: Fields of :class:`~microbatch.config.BatchConfig`.
    """

    def __init__(
        self,
        fn: Callable[[list[Any]], Sequence[Any]],
        config: BatchConfig | None = None,
        *,
        clock: Clock | None = None,
        **settings: Any,
    ) -> None:
        if config is not None and settings:
            raise TypeError("pass either config or keyword settings, not both")
        self.config = config if config is not None else BatchConfig(**settings)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._rows = row_format(self.config)
        self._fn = fn if self._rows is None else merged(fn, self._rows)
        self._policy = make_policy(self.config)
        self._queue: PendingQueue[_Entry] = PendingQueue(self.config.max_batch_size)
        self._state = self._queue.state
        self._stats = self._queue.stats
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._leader_waits = threading.Condition(self._lock)
        self._leader: _Call | None = None
        # Threads asleep on _leader_waits: normally only the leader, but a caller that
        # ran a batch for the next leader may leave an old leader asleep there too.
        self._sleepers = 0
        self._policy_sleepers = 0  # of those, the ones waiting for the policy's time
        self._free_slots = self.config.max_concurrent_batches
        self._closing = False
        self._runners: set[int] = set()  # threads running a batch now
        self._closers = 0  # threads waiting in close()
        self._now = time.monotonic if isinstance(self._clock, MonotonicClock) else self._clock.now

    # -- calling -----------------------------------------------------------------

    def submit(
        self, item: T, *, timeout_s: float | None = None, deadline: float | None = None
    ) -> R:
        """Queue one item and block until its own result is ready.

        Args:
            item: The item (with ``rows``: a sequence of rows).
            timeout_s: Give up after this many seconds (default: ``config.timeout_s``).
            deadline: Give up at this ``time.monotonic()`` time.

        Raises:
            Overloaded: The queue is full; nothing was queued.
            DeadlineExceeded: The deadline passed first.
            BatcherClosed: The batcher is closing.
            ItemTooLarge: One item is bigger than ``max_batch_size`` (without rows).
            RuntimeError: Called from inside this batcher's own batch function.
            Exception: Whatever the batch function raised or returned for this item.
        """
        if self._runners and threading.get_ident() in self._runners:
            raise RuntimeError("a batch function called its own batcher: that would deadlock")
        if timeout_s is None:
            timeout_s = self.config.timeout_s
        if timeout_s is not None:
            due = self._now() + timeout_s
            deadline = due if deadline is None else min(due, deadline)
        parts = self._parts(item)
        lock = self._lock
        with lock:
            call = self._enqueue(parts, deadline)
            while True:
                if self._leader is None:
                    self._leader = call
                if self._leader is call:
                    self._lead(call)
                if not call.pending:
                    break
                if call.deadline is not None and self._now() >= call.deadline:
                    self._expire(call)
                    break
                call.armed = True
                woken = False
                lock.release()
                try:
                    woken = call.signal.acquire(True, self._seconds_left(call))
                finally:
                    lock.acquire()
                    call.disarm(woken)
        return self._outcome(call)  # type: ignore[no-any-return]

    def stats(self) -> BatcherStats:
        """A snapshot of the counters (see :class:`~microbatch.stats.BatcherStats`)."""
        with self._lock:
            return self._stats.snapshot(self._state)

    def close(self, *, drain: bool = True) -> None:
        """Stop taking items; return when no item is queued or running.

        Args:
            drain: Let the queued items run (True), or answer them BatcherClosed.
        """
        with self._lock:
            self._closing = True
            if not drain:
                for entry in list(self._queue):
                    self._queue.drop(entry)
                    self._settle(entry, BatcherClosed("the batcher closed before this item ran"))
            self._leader_waits.notify_all()
            self._closers += 1
            try:
                while self._state.count or self._state.in_flight:
                    self._settled.wait()
            finally:
                self._closers -= 1

    def __enter__(self) -> CooperativeBatcher[T, R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- intake (lock held) ------------------------------------------------------

    def _parts(self, item: Any) -> list[tuple[Any, int]]:
        if self._rows is not None:
            return split_rows(self._rows, item, self.config.max_batch_size)
        size_fn = self.config.size_fn
        if size_fn is None:
            return [(item, 1)]
        size = size_fn(item)
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size_fn must return an int >= 1, got {size!r}")
        if size > self.config.max_batch_size:
            raise ItemTooLarge(
                f"item of size {size} exceeds max_batch_size={self.config.max_batch_size}"
            )
        return [(item, size)]

    def _enqueue(self, parts: list[tuple[Any, int]], deadline: float | None) -> _Call:
        if self._closing:
            raise BatcherClosed("the batcher is closed")
        state = self._state
        if state.count + len(parts) > self.config.max_queue:
            self._stats.rejected += 1
            raise Overloaded(f"the queue is full ({state.count} items waiting)")
        now = self._now()
        if deadline is not None and deadline <= now:
            self._stats.expired += 1
            raise DeadlineExceeded("the deadline passed before the item was queued")
        call = _Call(deadline)
        for item, size in parts:
            entry = _Entry(call, item, size, now)
            call.entries.append(entry)
            self._queue.add(entry, now)
        call.pending = len(parts)
        if self._policy_sleepers:
            self._leader_waits.notify_all()
        return call

    def _seconds_left(self, call: _Call) -> float:
        """Seconds until the call's deadline (0 if passed), or -1 for no deadline."""
        if call.deadline is None:
            return -1
        return max(call.deadline - self._now(), 0.0)

    def _outcome(self, call: _Call) -> Any:
        if len(call.entries) == 1:
            outcome = call.entries[0].outcome
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        outcomes = [entry.outcome for entry in call.entries]
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        if self._rows is not None and len(outcomes) > 1:
            return self._rows.join(outcomes)
        return outcomes[0]

    # -- leading (lock held) -----------------------------------------------------

    def _lead(self, call: _Call) -> None:
        """Release batches while this call leads; return once it is settled or not leading."""
        state = self._state
        while self._leader is call and call.pending:
            now = self._now()
            if call.deadline is not None and now >= call.deadline:
                self._expire(call)
                break
            timeout = None if call.deadline is None else call.deadline - now
            if not self._free_slots:
                self._leader_sleep(timeout)
                continue
            head = self._queue.head()
            if head is None or head.call is not call:
                break  # my items are all in flight: the next caller leads
            if not self._closing:
                at = self._policy.release_at(state, now)
                if at > now:
                    wait = at - now if timeout is None else min(at - now, timeout)
                    self._leader_sleep(wait, for_policy=True)
                    continue
            batch, units = self._take(now)
            self._run(batch, units)
            if not call.pending and self._full_batch_waits():
                # Under saturation, run the next full batch before returning: this
                # thread holds the GIL now, while the next leader would first have to
                # win it from every caller just woken, leaving the model idle.
                batch, units = self._take(self._now())
                self._run(batch, units)
        if self._leader is call:
            self._pass_lead()

    def _full_batch_waits(self) -> bool:
        return bool(self._free_slots) and self._state.size >= self.config.max_batch_size

    def _leader_sleep(self, timeout: float | None, *, for_policy: bool = False) -> None:
        self._sleepers += 1
        self._policy_sleepers += for_policy
        try:
            self._leader_waits.wait(timeout)
        finally:
            self._sleepers -= 1
            self._policy_sleepers -= for_policy

    def _wake_leader(self) -> None:
        if self._sleepers:
            self._leader_waits.notify_all()

    def _pass_lead(self) -> None:
        head = self._queue.head()
        self._leader = None if head is None else head.call
        if self._leader is not None:
            self._leader.wake()

    def _take(self, now: float) -> tuple[list[_Entry], int]:
        """Take the next batch into a slot and hand the lead to the next caller."""
        batch, units = self._queue.take(now)
        self._free_slots -= 1
        self._pass_lead()
        return batch, units

    def _run(self, batch: list[_Entry], units: int) -> None:
        """Run a batch with the lock released; settle its items with it held again."""
        items = [entry.item for entry in batch]
        outcomes: list[Any] | None = None
        me = threading.get_ident()
        self._runners.add(me)
        self._lock.release()
        try:
            start = self._now()
            outcomes = run_batch(
                self._fn, items, self.config.isolate_errors, lambda i: batch[i].outcome is _PENDING
            )
            end = self._now()
        finally:
            self._lock.acquire()
            self._runners.discard(me)
            if outcomes is None:
                for entry in batch:
                    self._settle(entry, MicrobatchError("the batch was aborted"))
                end = self._now()
            self._state.finished(len(batch), end)
            self._free_slots += 1
            self._wake_leader()
        self._policy.batch_finished(units, end - start)
        for entry, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._stats.failed += 1
            self._settle(entry, outcome)
        if self._closers and not (self._state.count or self._state.in_flight):
            self._settled.notify_all()

    # -- settling (lock held) ----------------------------------------------------

    def _settle(self, entry: _Entry, outcome: Any) -> None:
        if entry.outcome is not _PENDING:
            return
        entry.outcome = outcome
        call = entry.call
        call.pending -= 1
        if not call.pending:
            call.wake()

    def _expire(self, call: _Call) -> None:
        for entry in call.entries:
            if entry.outcome is _PENDING:
                self._stats.expired += 1
                if entry.queued:
                    self._queue.drop(entry)
                self._settle(
                    entry, DeadlineExceeded("the deadline passed before the result was ready")
                )
        if self._closers and not (self._state.count or self._state.in_flight):
            self._settled.notify_all()
