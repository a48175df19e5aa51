"""The thread batcher: callers in plain threads block for one item each; asyncio
callers (:meth:`CooperativeBatcher.asubmit`) await theirs, in the same queue.

There is no background thread. The caller that owns the oldest queued item is the
*leader*: it waits (on a condition, never a poll) until a slot is free and the
policy says go, takes a batch from the head of the queue, hands the lead to the
owner of the next queued item, runs the batch in its own thread, and settles every
item of it. Followers sleep until their items are settled or the lead comes to
them. An asyncio caller cannot block its loop, so when the lead comes to it a pool
thread leads (and runs the batch) in its place. Every wait has a way out (its
caller's deadline, a settled item, the lead); whatever escapes a leader
(``KeyboardInterrupt`` included) passes the lead on and answers its items; and a
batch function that calls its own batcher gets an error instead of a deadlock.

With :class:`~microbatch.testing.FakeClock` every timed wait is a timer on the fake
clock instead: advancing it past a deadline or a policy time wakes the waiter.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from types import TracebackType
from typing import Any, Generic, TypeVar

from ._batch_timing import record_batch
from ._calls import PENDING as _PENDING
from ._calls import Call as _Call
from ._calls import Entry as _Entry
from ._calls import LoopCall as _LoopCall
from ._calls import ThreadCall as _ThreadCall
from ._intake import Intake, Part
from ._loop_answers import LoopAnswers
from .clock import Clock, MonotonicClock
from .config import BatchConfig
from .errors import BatcherClosed, DeadlineExceeded, MicrobatchError
from .execution import run_batch
from .merge import merged
from .policy import Policy
from .stats import BatcherStats
from .timing import Timing

__all__ = ["CooperativeBatcher"]

_SENT = -1  # a pool thread was sent to lead for asyncio callers
_EXPIRED = "the deadline passed before the result was ready"

T = TypeVar("T")
R = TypeVar("R")


class CooperativeBatcher(Generic[T, R]):
    """Gathers items submitted from many threads (and event loops) into batches.

    ``fn`` takes a list of items and returns a sequence of results of the same
    length (an exception instance at position ``i`` fails only item ``i``). It runs
    in the thread of one of the callers in the batch (or, for a batch led for an
    asyncio caller, in a pool thread); that caller's deadline cannot cut the model
    short in its own thread, so it is answered when the batch returns (every other
    caller is answered at its deadline).

    Args:
        fn: The batch function.
        config: Batching settings; or pass them as keyword arguments.
        clock: Time source for the policy and deadlines (``time.monotonic`` scale).
            A clock other than :class:`~microbatch.clock.MonotonicClock` must run
            ``call_at`` callbacks from any thread, as FakeClock does.
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
        self._real_time = isinstance(self._clock, MonotonicClock)
        self._now = time.monotonic if self._real_time else self._clock.now
        self._intake: Intake[_Entry] = Intake(self.config, self._now)
        self._fn = fn if self._intake.rows is None else merged(fn, self._intake.rows)
        self._policy = self._intake.policy
        self._queue = self._intake.queue
        self._state = self._intake.state
        self._stats = self._intake.stats
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._leader_waits = threading.Condition(self._lock)
        self._leader: _Call | None = None
        # Threads asleep on _leader_waits: normally only the leader, but a caller that
        # ran a batch for the next leader may leave an old leader asleep there too.
        self._sleepers = 0
        self._policy_sleepers = 0  # of those, the ones waiting for the policy's time
        self._free_slots = self.config.max_concurrent_batches
        self._runners: set[int] = set()  # threads running a batch now
        self._closers = 0  # threads waiting in close()
        self._leaders: ThreadPoolExecutor | None = None  # lead for asyncio callers
        self._answers = LoopAnswers(self._intake.result)  # asyncio callers settled
        # The pool thread on duty to lead for asyncio callers: its id, _SENT while
        # one is on its way, None when none is (then no slot is free, or no asyncio
        # caller leads). Pool threads leading or running a batch: _drivers.
        self._duty: int | None = None
        self._drivers: set[int] = set()

    @property
    def policy(self) -> Policy:
        """This batcher's own policy (a fresh one, made from ``config.policy``)."""
        return self._policy

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
        due, parts = self._due_and_parts(item, timeout_s, deadline)
        with self._lock:
            call = _ThreadCall(due)
            self._enqueue(call, parts)
            try:
                self._wait_for(call)
            except BaseException:
                self._abandon(call)
                raise
        entries = call.entries
        if len(entries) == 1:
            outcome = entries[0].outcome
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome  # type: ignore[no-any-return]
        return self._intake.result([e.outcome for e in entries])  # type: ignore[no-any-return]

    async def asubmit(
        self,
        item: T,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
        timing: Timing | None = None,
    ) -> R:
        """Queue one item from asyncio code, in the same queue as the threads'; the
        batch runs in a thread (a blocked caller's or a pool thread), never in the
        event loop. Raises as :meth:`submit`. ``timing`` gets this batch's entry
        (see :mod:`microbatch.timing`); its first part's batch speaks for it."""
        due, parts = self._due_and_parts(item, timeout_s, deadline)
        call = _LoopCall(due, asyncio.get_running_loop())
        call.timing = timing
        with self._lock:
            self._enqueue(call, parts)
            if self._leader is None:
                self._leader = call
                self._ensure_lead()
        timer = None if due is None else self._clock.call_at(due, partial(self._timed_out, call))
        try:
            return await call.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            with self._lock:
                self._abandon(call)
            raise
        finally:
            if timer is not None:
                timer.cancel()

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
            self._intake.closing = True
            if not drain:
                for entry in list(self._queue):
                    self._queue.drop(entry)
                    self._settle(entry, BatcherClosed("the batcher closed before this item ran"))
                self._settled_some()
            self._leader_waits.notify_all()
            self._closers += 1
            try:
                while self._state.count or self._state.in_flight:
                    self._settled.wait()
            finally:
                self._closers -= 1
            leaders, self._leaders = self._leaders, None
        if leaders is not None:
            leaders.shutdown(wait=False)

    def __enter__(self) -> CooperativeBatcher[T, R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- intake and waiting (lock held) ------------------------------------------

    def _due_and_parts(
        self, item: Any, timeout_s: float | None, deadline: float | None
    ) -> tuple[float | None, list[Part]]:
        """The item's deadline, worked out here once, and its queued parts (no lock)."""
        intake = self._intake
        if intake.plain and timeout_s is None and deadline is None:
            return None, [Part(item, 1, 1.0, 1.0, 1)]  # nothing to work out
        return intake.deadline(timeout_s, deadline), intake.parts(item)

    def _enqueue(self, call: _Call, parts: list[Part]) -> None:
        now = self._intake.admit(len(parts), call.deadline)
        for part in parts:
            entry = _Entry(call, part.item, part.units, now)
            part.measure(entry)
            call.entries.append(entry)
            self._queue.add(entry, now)
        call.pending = len(parts)
        if self._policy_sleepers:
            self._leader_waits.notify_all()

    def _wait_for(self, call: _ThreadCall) -> None:
        """Lead or follow until the call is settled (lock held, released meanwhile)."""
        while True:
            if self._leader is None:
                self._leader = call
            if self._leader is call:
                self._lead(call)
            if not call.pending:
                return
            due = call.deadline
            timer = None
            if due is not None and not self._real_time:  # a fake clock's timer wakes it
                timer = self._clock.call_at(due, partial(self._wake_call, call))
            if due is not None and self._now() >= due:
                if timer is not None:
                    timer.cancel()
                self._expire(call)
                return
            wait_s = None if due is None or timer is not None else due - self._now()
            try:
                call.sleep(self._lock, wait_s)
            finally:
                if timer is not None:
                    timer.cancel()

    def _wake_call(self, call: _ThreadCall) -> None:
        """A fake-clock timer: the call's deadline came."""
        with self._lock:
            call.wake()

    def _timed_out(self, call: _LoopCall) -> None:
        """The deadline of an asyncio caller came (a clock timer)."""
        with self._lock:
            if call.pending:
                self._expire(call)
                if self._leader is call:
                    if self._duty is None:  # nobody leads for it now: pass it on here
                        self._pass_lead()
                    else:
                        self._wake_leader()

    def _abandon(self, call: _Call) -> None:
        """The caller stopped waiting (cancelled, or interrupted by whatever escaped
        it): answer its items, and pass the lead on if it held it."""
        for entry in call.entries:
            if entry.outcome is _PENDING:
                if entry.queued:
                    self._stats.cancelled += 1
                    self._queue.drop(entry)
                self._settle(entry, MicrobatchError("the caller stopped waiting"))
        if self._leader is call:
            self._pass_lead()
        self._wake_leader()
        self._settled_some()

    # -- leading (lock held) -----------------------------------------------------

    def _lead(self, call: _Call) -> None:
        """Release batches while this call leads; return once it is settled or not leading."""
        state = self._state
        while self._leader is call and call.pending:
            now = self._now()
            if call.deadline is not None and now >= call.deadline:
                self._expire(call)
                break
            if not self._free_slots:
                self._leader_sleep(call.deadline)
                continue
            head = self._queue.head()
            if head is None or head.call is not call:
                break  # my items are all in flight: the next caller leads
            if not self._intake.closing:
                at = self._policy.release_at(state, now)
                if at > now:
                    due = call.deadline
                    self._leader_sleep(at if due is None else min(at, due), for_policy=True)
                    continue
            self._run(*self._take(now))
            if not call.pending and self._full_batch_waits():
                # Under saturation, run the next full batch before returning: this
                # thread holds the GIL now, while the next leader would first have to
                # win it from every caller just woken, leaving the model idle.
                self._run(*self._take(self._now()))
        if self._leader is call:
            self._pass_lead()

    def _full_batch_waits(self) -> bool:
        return bool(self._free_slots) and self._state.size >= self.config.max_batch_size

    def _leader_sleep(self, until: float | None, *, for_policy: bool = False) -> None:
        self._sleepers += 1
        self._policy_sleepers += for_policy
        try:
            if until is None:
                self._leader_waits.wait()
            elif self._real_time:
                self._leader_waits.wait(max(until - self._now(), 0.0))
            else:
                timer = self._clock.call_at(until, self._wake_leader_locked)
                try:
                    if self._now() < until:
                        self._leader_waits.wait()
                finally:
                    timer.cancel()
        finally:
            self._sleepers -= 1
            self._policy_sleepers -= for_policy

    def _wake_leader_locked(self) -> None:
        with self._lock:
            self._leader_waits.notify_all()

    def _wake_leader(self) -> None:
        if self._sleepers:
            self._leader_waits.notify_all()

    def _pass_lead(self) -> None:
        head = self._queue.head()
        leader = self._leader = None if head is None else head.call
        if isinstance(leader, _ThreadCall):
            leader.wake()
        else:
            self._ensure_lead()

    def _ensure_lead(self) -> None:
        """An asyncio caller leads: when a slot is free, make sure a pool thread leads
        in its place (one at a time). With no slot free, the thread that frees one
        comes back here (or, a pool thread, leads on itself)."""
        if not isinstance(self._leader, _LoopCall) or self._duty is not None:
            return
        if not self._free_slots:
            return
        if self._leaders is None:
            # One thread per slot (each may run a batch) and one to lead meanwhile.
            self._leaders = ThreadPoolExecutor(
                self.config.max_concurrent_batches + 1, thread_name_prefix="microbatch-lead"
            )
        self._duty = _SENT
        self._leaders.submit(self._drive)

    def _drive(self) -> None:
        """In a pool thread: lead for asyncio callers while one leads and no other
        pool thread is on duty; a batch taken is run here (off duty meanwhile)."""
        me = threading.get_ident()
        with self._lock:
            self._drivers.add(me)
            if self._duty == _SENT:
                self._duty = None
            try:
                while isinstance(self._leader, _LoopCall) and self._duty in (me, None):
                    self._duty = me
                    self._lead(self._leader)
            except BaseException:  # the batch's items are answered already
                if isinstance(self._leader, _LoopCall):
                    self._pass_lead()
            finally:
                self._drivers.discard(me)
                if self._duty == me:
                    self._duty = None
                self._ensure_lead()

    def _take(self, now: float) -> tuple[list[_Entry], int]:
        """Take the next batch into a slot and hand the lead to the next caller."""
        batch, units = self._queue.take(now)
        self._free_slots -= 1
        if self._duty is not None and self._duty == threading.get_ident():
            self._duty = None  # a pool thread about to run a batch is off duty
        self._pass_lead()
        return batch, units

    def _run(self, batch: list[_Entry], units: int) -> None:
        """Run a batch with the lock released; settle its items with it held again."""
        items = [entry.item for entry in batch]
        outcomes: list[Any] | None = None
        me = threading.get_ident()
        self._runners.add(me)
        self._lock.release()
        start = end = self._now()
        memory = self._intake.memory_splits()
        try:
            outcomes = run_batch(
                self._fn,
                items,
                self.config.isolate_errors,
                lambda i: batch[i].outcome is _PENDING,
                memory,
            )
            end = self._now()
        finally:
            self._lock.acquire()
            self._runners.discard(me)
            if outcomes is None:  # something escaped the model: answer every item
                for entry in batch:
                    self._settle(entry, MicrobatchError("the batch was aborted"))
                end = self._now()
            self._state.finished(len(batch), end)
            self._free_slots += 1
            self._wake_leader()
            if me not in self._drivers:  # a pool thread leads on by itself
                self._ensure_lead()
            if outcomes is None:
                self._settled_some()
        self._policy.batch_finished(units, end - start)
        failed = () if memory is None else memory.failed
        self._intake.finished(batch, failed, end - start)
        timed: list[tuple[Timing, float]] = []  # callers' records, with their arrival
        for entry, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._stats.failed += 1
            call = entry.call
            # A request's first part's batch speaks for it; a batch here starts as taken.
            if isinstance(call, _LoopCall) and call.timing is not None and entry is call.entries[0]:
                timed.append((call.timing, entry.arrival))
            self._settle(entry, outcome)
        if timed:
            cost = sum(e.cost for e in batch) if self.config.cost_fn is not None else None
            name = getattr(self._fn, "__name__", "")
            record_batch(name, timed, start, start, end, units, cost)
        self._settled_some()

    # -- settling (lock held) ----------------------------------------------------

    def _settle(self, entry: _Entry, outcome: Any) -> None:
        if entry.outcome is not _PENDING:
            return
        entry.outcome = outcome
        call = entry.call
        call.pending -= 1
        if call.pending:
            return
        if isinstance(call, _ThreadCall):
            call.wake()
        elif isinstance(call, _LoopCall):
            self._answers.add(call)  # answered together, by _settled_some()

    def _expire(self, call: _Call) -> None:
        for entry in call.entries:
            if entry.outcome is _PENDING:
                self._stats.expired += 1
                if entry.queued:
                    self._queue.drop(entry)
                self._settle(entry, DeadlineExceeded(_EXPIRED))
        self._settled_some()

    def _settled_some(self) -> None:
        """After settling items: answer the asyncio callers settled (one callback
        per loop, not one wake-up of the loop per item), and wake close()."""
        self._answers.send()
        if self._closers and not (self._state.count or self._state.in_flight):
            self._settled.notify_all()
