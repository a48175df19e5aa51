"""Step-wise (continuous) batching: the asyncio loop that runs a step model one step
at a time over its active items, letting finished items leave and queued ones join
between two steps.

Each step is one :class:`~microbatch.step_contract.StepJob` handed to a
:class:`~microbatch.step_contract.StepRunner` (the model in this process, a worker
thread, or a worker process, where the items' states live): the keys of the items
that join (with the items), the keys of the items that left, and implicitly a step
over every active item. The runner answers a
:class:`~microbatch.step_contract.StepDone`: one chunk (or error, or end) per
active item. That contract, and the admission policies, are in
:mod:`microbatch.step_contract`.

The loop decides who joins at each step with an admission policy (a pure function
of how many are active and waiting): :func:`continuous` fills every free place at
every step, so arrivals never wait for a long item to finish and running items are
never pushed out by arrivals; :func:`lockstep` admits only into an empty batch (what
a generator ``predict`` needs: its batch runs until its longest item ends).

Admission also keeps the active items within a cost budget (``max_cost``, counted as
:func:`~microbatch.composition.batch_cost` counts a batch: ``"padded"``, the largest
item cost times the items, or ``"sum"``), first come first served: the oldest
waiting item joins first, and none behind it overtakes it, so no item starves (the
active items end, and an item fits alone or is refused when it is opened with
:class:`~microbatch.errors.ItemTooLarge`). Starting items costs about a step, which
every active item waits for: with ``min_joiners`` the loop, while items are active,
lets joiners gather until that many wait or the oldest has waited
``max_join_wait_s``, so that one start serves several of them.

Where the runner steps elsewhere (a thread, a process), the next step starts before
the last one's chunks are handed out; the streams that ended may go first, so that
their callers can join it (``StepLoop._ended_first``, :mod:`microbatch._loop_turns`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ._batch_timing import record_step, traced_stream
from ._loop_turns import Comebacks, Turn
from ._timer_heap import TimerHeap
from .clock import Clock, MonotonicClock
from .composition import BatchCostMode
from .errors import BatcherClosed, ItemTooLarge, Overloaded
from .stats import StreamStats, StreamStatsRecorder
from .step_contract import (
    END,
    AdmissionPolicy,
    Started,
    StepDone,
    StepJob,
    StepRunner,
    continuous,
    lockstep,
)
from .streams import MAX_BUFFERED_CHUNKS, Channel, Stream

__all__ = [  # the step contract's names too, where they were first defined
    "END",
    "AdmissionPolicy",
    "Started",
    "StepDone",
    "StepJob",
    "StepLoop",
    "StepRunner",
    "continuous",
    "lockstep",
]

logger = logging.getLogger("microbatch.stepping")


class StepLoop:
    """Runs one :class:`StepRunner` step after step while it has items, admitting
    waiting items between steps.

    One task runs the steps; it exists only while there is work, and a failure of
    the runner fails the active items, never the loop (nothing is left hanging).

    Args:
        runner: Where the steps run.
        max_active: Most items stepped at once.
        max_queue: Most items waiting to join; one more is refused with
            :class:`~microbatch.errors.Overloaded` before its stream starts.
        admission: The admission policy (:func:`continuous` or :func:`lockstep`).
        clock: Reads the time and sets the streams' deadline timers.
        name: Shown in errors.
        restart: When the runner fails (its worker died), start its active items
            again, once each, instead of failing them: for models whose steps are
            idempotent (the same item gives the same chunks), the chunks a caller
            got already are made again but not sent again.
        cost_fn: The cost of one item (tokens, pixels): a number >= 0.
        max_cost: Most cost of the active items together (with ``cost_fn``); an
            item that costs more alone is refused when opened.
        cost_mode: How the active items' cost is counted: ``"padded"`` (their
            largest cost times their number) or ``"sum"``.
        min_joiners: While items are active, joiners wait until this many wait
            (or as many as there are free places) ...
        max_join_wait_s: ... or until the oldest has waited this long.
        max_buffered: Most chunks a stream holds unread: a caller that reads
            more slowly gets :class:`~microbatch.streams.SlowReader` after them, and
            its item leaves at the next step (None: no limit).
    """

    def __init__(
        self,
        runner: StepRunner,
        *,
        max_active: int,
        max_queue: int = 4096,
        admission: AdmissionPolicy = continuous,
        clock: Clock | None = None,
        name: str = "steps",
        restart: bool = False,
        cost_fn: Callable[[Any], float] | None = None,
        max_cost: float | None = None,
        cost_mode: BatchCostMode = "padded",
        min_joiners: int = 1,
        max_join_wait_s: float = 0.0,
        max_buffered: int | None = MAX_BUFFERED_CHUNKS,
    ) -> None:
        if not isinstance(max_active, int) or max_active < 1:
            raise ValueError(f"max_active must be an int >= 1, got {max_active!r}")
        if max_cost is not None and (cost_fn is None or not max_cost > 0):
            raise ValueError(f"max_cost needs a cost_fn and must be > 0, got {max_cost!r}")
        if cost_mode not in ("padded", "sum"):
            raise ValueError(f"cost_mode must be 'padded' or 'sum', got {cost_mode!r}")
        if min_joiners < 1 or max_join_wait_s < 0:
            raise ValueError("min_joiners must be >= 1 and max_join_wait_s >= 0")
        if max_buffered is not None and max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1 or None, got {max_buffered!r}")
        self.cost_fn = cost_fn
        self.max_cost = max_cost
        self.cost_mode: BatchCostMode = cost_mode
        self.min_joiners = min_joiners
        self.max_join_wait_s = max_join_wait_s
        self.max_buffered = max_buffered
        self._costs: dict[int, float] = {}  # key -> cost, of the open streams
        self._arrivals: dict[int, float] = {}  # key -> when it was opened
        self.runner = runner
        self.max_active = max_active
        self.max_queue = max_queue
        self.admission = admission
        self.name = name
        self.restart = restart
        self._replayed: dict[int, int] = {}  # key -> chunks still to make again, unsent
        self._restarted: set[int] = set()  # keys started again once already
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        # Every stream's deadline waits on one timer of the clock, not one each.
        self._deadlines = TimerHeap(self._clock)
        self._keys = itertools.count()
        self._waiting: deque[Channel] = deque()
        self._active: dict[int, Channel] = {}
        self._task: asyncio.Task[None] | None = None
        self._stepping = StepJob()  # the job of the step running now
        self._closed = False
        self._idle: asyncio.Event | None = None
        self.recorder = StreamStatsRecorder()
        self._traced: dict[int, Any] = {}  # key -> a traced stream's Timing (tracing.py)
        self._comebacks = Comebacks()

    @property
    def load(self) -> int:
        """Items active or waiting."""
        return len(self._active) + len(self._waiting)

    @property
    def active(self) -> int:
        """Items stepped now."""
        return len(self._active)

    def stats(self) -> StreamStats:
        """A snapshot of the stream counters."""
        return StreamStats.of(self.recorder, len(self._active), len(self._waiting))

    def open(
        self,
        item: Any,
        *,
        deadline: float | None = None,
        first_chunk_deadline: float | None = None,
        on_end: Callable[[Channel], None] | None = None,
    ) -> Stream:
        """Queue ``item``; its chunks come on the stream returned.

        Raises:
            BatcherClosed: The loop is closing.
            Overloaded: ``max_queue`` items wait already.
            ItemTooLarge: The item alone costs more than ``max_cost``.
            ValueError: ``cost_fn`` gave no number >= 0.
        """
        if self._closed:
            raise BatcherClosed(f"{self.name} is shutting down")
        cost = self._cost_of(item)
        if len(self._waiting) >= self.max_queue:
            self._discard_left()
            if len(self._waiting) >= self.max_queue:
                self.recorder.rejected += 1
                raise Overloaded(f"{len(self._waiting)} streams wait to start")

        def ended(stream: Channel) -> None:
            self.recorder.ended(stream, self._clock.now())
            self._restarted.discard(stream.key)
            self._replayed.pop(stream.key, None)
            self._costs.pop(stream.key, None)
            self._arrivals.pop(stream.key, None)
            self._traced.pop(stream.key, None)
            if on_end is not None:
                on_end(stream)

        channel = Channel(
            next(self._keys),
            item,
            deadline=deadline,
            first_chunk_deadline=first_chunk_deadline,
            clock=self._deadlines,
            on_end=ended,
            max_buffered=self.max_buffered,
        )
        self._waiting.append(channel)
        if cost is not None:
            self._costs[channel.key] = cost
        self._arrivals[channel.key] = self._clock.now()
        traced = traced_stream.get()
        if traced is not None:  # each step that serves it links to its span
            self._traced[channel.key] = traced
        self.recorder.opened += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return Stream(channel)

    async def close(self, grace_s: float = 0.0) -> None:
        """Refuse new items, let the open streams run for up to ``grace_s`` seconds,
        then end the rest with :class:`~microbatch.errors.BatcherClosed`."""
        self._closed = True
        if self._task is not None and grace_s > 0:
            self._idle = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace_s)
        closed = BatcherClosed(f"{self.name} shut down before the stream ended")
        for stream in [*self._waiting, *self._active.values()]:
            stream.finish(closed)
        self._waiting.clear()
        task = self._task
        if task is not None:
            # The running step ends with the streams already ended; wait for it so
            # that the runner is idle when it is closed.
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the steps ----------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        pending: Awaitable[StepDone] | None = None
        outcomes: list[tuple[Channel, Any, bool]] = []  # settled, not yet handed out
        try:
            pending = self._advance()
            while pending is not None:
                turn = Turn(loop)
                try:
                    done = await pending
                except Exception as error:  # the states are gone
                    pending = None
                    self._lost(error)
                    pending = self._advance()
                    continue
                pending = None
                outcomes = self._settle(done)
                if turn.over():
                    # The runner steps elsewhere (a worker thread or process): the
                    # next step starts before this one's chunks are handed out, so
                    # that the callers read them while it runs (the streams that
                    # ended may go first: see _ended_first).
                    outcomes = await self._ended_first(outcomes)
                    pending = self._advance()
                    self._deliver(outcomes)
                    outcomes = []
                else:
                    # It computed in this thread and the event loop did not turn:
                    # the callers read first, then the next step is made.
                    self._deliver(outcomes)
                    outcomes = []
                    await asyncio.sleep(0)
                    pending = self._advance()
        except Exception as error:  # a bug here must not leave a stream hanging
            logger.exception("%s: the step loop failed; its streams end with the error", self.name)
            _abandon(pending)
            self._end_all(error, outcomes)
        except BaseException:  # cancelled (the event loop is shutting down)
            _abandon(pending)
            stopped = BatcherClosed(f"{self.name} stopped before the stream ended")
            self._end_all(stopped, outcomes)
            raise
        finally:
            self._task = None
            if self._idle is not None:
                self._idle.set()

    def _advance(self) -> Awaitable[StepDone] | None:
        """The next step handed to the runner (None when there is nothing to do)."""
        job = self._next_job()
        if job is None:
            return None
        self._stepping = job
        return self.runner.advance(job)

    def _next_job(self) -> StepJob | None:
        """The next step: who leaves, who joins; None when there is nothing to do."""
        active = self._active
        leave = tuple([key for key, stream in active.items() if stream.ended])
        for key in leave:
            del active[key]
        if self._waiting:
            self._discard_left()
        joining = self.admission(len(active), len(self._waiting), self.max_active)
        if joining and active and not self._gathered(joining):
            joining = 0
        keys: list[int] = []
        items: list[Any] = []
        if joining:
            budget = _Budget(self.max_cost, self.cost_mode)
            if self.max_cost is not None:
                for key in active:
                    budget.add(self._costs.get(key, 0.0))
            for _ in range(joining):
                cost = self._costs.get(self._waiting[0].key, 0.0)
                if active and not budget.fits(cost):
                    break  # first come first served: nobody overtakes the oldest
                budget.add(cost)
                stream = self._waiting.popleft()
                active[stream.key] = stream
                keys.append(stream.key)
                items.append(stream.item)
        if not active and not leave:
            return None
        return StepJob(tuple(keys), tuple(items), leave)

    def _cost_of(self, item: Any) -> float | None:
        """The cost of ``item`` (None without ``cost_fn``), checked against the budget."""
        if self.cost_fn is None:
            return None
        cost = self.cost_fn(item)
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not cost >= 0:
            raise ValueError(f"cost_fn must return a number >= 0, got {cost!r}")
        if self.max_cost is not None and cost > self.max_cost:
            raise ItemTooLarge(f"item of cost {cost:g} exceeds max_batch_cost={self.max_cost:g}")
        return float(cost)

    def _gathered(self, joining: int) -> bool:
        """Whether enough joiners gathered (or the oldest waited long enough) to be
        worth a start that every active item waits for."""
        if joining >= self.min_joiners or len(self._waiting) >= self.min_joiners:
            return True
        if joining >= self.max_active - len(self._active):
            return True  # they fill every free place
        oldest = self._arrivals.get(self._waiting[0].key, self._clock.now())
        return self._clock.now() - oldest >= self.max_join_wait_s

    def _end_all(self, error: Exception, outcomes: list[tuple[Channel, Any, bool]]) -> None:
        """End every waiting and active stream, and those of ``outcomes`` (settled
        but not handed out), with ``error``."""
        settled = [stream for stream, _, _ in outcomes]
        for stream in [*self._waiting, *self._active.values(), *settled]:
            stream.finish(error)
        self._waiting.clear()
        self._active.clear()

    def _lost(self, error: Exception) -> None:
        """The runner lost its states: its items fail with ``error``, or, with
        ``restart``, start again (once each) at the head of the queue."""
        again = []
        for key, stream in self._active.items():
            if self.restart and key not in self._restarted and not stream.ended:
                self._restarted.add(key)
                self._replayed[key] = stream.chunks_sent
                again.append(stream)
            else:
                stream.finish(error)
        self._active.clear()
        self._waiting.extendleft(reversed(again))

    def _discard_left(self) -> None:
        if any(stream.ended for stream in self._waiting):
            self._waiting = deque(stream for stream in self._waiting if not stream.ended)

    def _settle(self, done: StepDone) -> list[tuple[Channel, Any, bool]]:
        """A step's outcomes, each with its stream, in the order they are handed out
        (the first chunks of streams first, so that their readers are the first to
        wake in the next turn of the event loop: a writer per stream runs then, and
        a new stream's first chunk does not wait behind the running streams' next
        ones); the items that ended with the step leave the active ones now, so
        that the next step can start before the chunks are handed out."""
        if self._traced:  # some streams are traced: so is the step
            record_step(self.name, self._traced, len(self._stepping.join_keys), done)
        active = self._active
        self.recorder.stepped(len(active), done.started_s, done.finished_s)
        firsts: list[tuple[Channel, Any, bool]] = []
        outcomes: list[tuple[Channel, Any, bool]] = []
        for key, chunk, finished in zip(done.keys, done.chunks, done.finished, strict=True):
            stream = active.get(key)
            if stream is None:
                continue
            if finished or chunk is END or isinstance(chunk, BaseException):
                finished = True
                del active[key]
            if stream.chunks_sent:
                outcomes.append((stream, chunk, finished))
            else:
                firsts.append((stream, chunk, finished))
        if firsts:
            firsts.extend(outcomes)
            return firsts
        return outcomes

    async def _ended_first(
        self, outcomes: list[tuple[Channel, Any, bool]]
    ) -> list[tuple[Channel, Any, bool]]:
        """Hand out the outcomes that end their streams, and let the event loop turn
        once before the next step starts, so that callers who open their next
        stream at once (in-process callers in a closed loop) join that step rather
        than wait a whole step for the one after; the outcomes left to hand out.
        Only where the next step could take a newcomer, and while such turns bring
        callers back (callers over a network come back later: the turn would only
        keep the model waiting)."""
        if not self.admission(len(self._active), 1, self.max_active):
            return outcomes
        ended = [outcome for outcome in outcomes if outcome[2]]
        if not ended or not self._comebacks.worth_a_turn():
            return outcomes
        self._deliver(ended)
        waiting = len(self._waiting)
        await asyncio.sleep(0)
        self._comebacks.turned(len(self._waiting) - waiting, len(ended))
        return [outcome for outcome in outcomes if not outcome[2]]

    def _deliver(self, outcomes: list[tuple[Channel, Any, bool]]) -> None:
        """Hand each outcome to its stream (all at the time of one clock reading)."""
        now = self._clock.now()
        record = self.recorder.chunk
        replayed = self._replayed
        for stream, chunk, finished in outcomes:
            if isinstance(chunk, BaseException):
                stream.finish(chunk)
                continue
            if chunk is not END:
                if replayed and replayed.get(stream.key):  # made again after a restart
                    replayed[stream.key] -= 1  # sent already
                else:
                    record(stream, now)
                    stream.push(chunk, now)
            if finished:
                stream.finish()


def _abandon(pending: Awaitable[StepDone] | None) -> None:
    """Let go of a step the loop will not wait for (it failed, or was cancelled)."""
    if isinstance(pending, Coroutine):
        pending.close()  # never started: nothing ran
    elif isinstance(pending, asyncio.Future):
        pending.add_done_callback(_retrieved)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "never retrieved" warning


class _Budget:
    """The running cost of the active items (``max_cost`` None: no limit)."""

    __slots__ = ("count", "limit", "mode", "peak", "total")

    def __init__(self, limit: float | None, mode: BatchCostMode) -> None:
        self.limit = limit
        self.mode = mode
        self.count = 0
        self.peak = 0.0
        self.total = 0.0

    def cost_with(self, cost: float) -> float:
        """The cost of the active items if one of ``cost`` joined them."""
        if self.mode == "sum":
            return self.total + cost
        return max(self.peak, cost) * (self.count + 1)

    def fits(self, cost: float) -> bool:
        """Whether one of ``cost`` may join."""
        return self.limit is None or self.cost_with(cost) <= self.limit

    def add(self, cost: float) -> None:
        self.count += 1
        self.peak = max(self.peak, cost)
        self.total += cost
