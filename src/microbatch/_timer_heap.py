"""Many timers on one (:class:`TimerHeap`): the deadlines of a step loop's streams,
set and mostly called off once per stream. Its own module so that the wheel
compiles it."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable

from .clock import Clock, Timer

__all__ = ["TimerHeap"]

logger = logging.getLogger("microbatch")


class TimerHeap:
    """Many timers on one: a :class:`Clock` whose timers wait in a heap, served by
    a single timer of ``clock`` set at the earliest. Setting and calling off a timer
    costs a heap entry, not one of the event loop's timers each: for deadlines that
    are set for every stream or connection and mostly called off.

    A timer called off stays in the heap until it comes up (or until called-off
    ones are most of it, when the heap is rebuilt without them). The batcher's
    :class:`~microbatch._deadlines.DeadlineWatch` keeps its items' deadlines the same
    way but is never told of an answer: it asks each item's future. A stream has no
    future to ask, and its deadline moves at its first chunk, so its timer is called
    off instead. Callbacks run in
    the order of their times, then of their setting; one that raises is logged and
    the others still run.

    Args:
        clock: Whose time it reads and whose one timer it sets.
    """

    __slots__ = ("_armed_at", "_clock", "_heap", "_order", "_stale", "_timer", "now")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.now: Callable[[], float] = clock.now
        """The clock's time (its own method: no call in between)."""
        self._heap: list[tuple[float, int, _HeapTimer]] = []
        self._order = itertools.count()
        self._stale = 0  # timers called off, still in the heap
        self._timer: Timer | None = None
        self._armed_at = math.inf

    def __len__(self) -> int:
        """Timers waiting, called-off ones included until they leave the heap."""
        return len(self._heap)

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` at ``when`` on the clock's scale."""
        timer = _HeapTimer(callback, self)
        heapq.heappush(self._heap, (when, next(self._order), timer))
        if when < self._armed_at:
            self._arm(when)
        return timer

    def _called_off(self) -> None:
        self._stale += 1
        heap = self._heap
        if self._stale > 64 and 2 * self._stale > len(heap):
            heap[:] = [entry for entry in heap if not entry[2].off]
            heapq.heapify(heap)
            self._stale = 0

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = when
        self._timer = self._clock.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._armed_at = math.inf
        heap = self._heap
        now = self._clock.now()
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)[2]
            if timer.off:
                self._stale -= 1
                continue
            timer.off = True
            try:
                timer.callback()
            except Exception:
                logger.exception("a timer's callback failed")
        if heap and heap[0][0] < self._armed_at:
            self._arm(heap[0][0])


class _HeapTimer:
    """One timer of a :class:`TimerHeap`."""

    __slots__ = ("callback", "heap", "off")

    def __init__(self, callback: Callable[[], object], heap: TimerHeap) -> None:
        self.callback = callback
        self.heap = heap
        self.off = False  # ran, or called off

    def cancel(self) -> None:
        """Do not run the callback (no effect if it already ran)."""
        if not self.off:
            self.off = True
            self.heap._called_off()
