"""Every waiting item's deadline on one timer: the earliest.

A batcher used to set a timer per item (about 3 us of CPU to set and cancel on
uvloop, for nearly every HTTP request: each one has a deadline). Here one timer is
armed for the earliest deadline; when it fires, every item past its deadline that
still waits is expired, and the timer is armed for the next.

Most deadlines come in the order of their items, since most requests take the same
default timeout: those wait in a plain list, in arrival order, which is their
deadlines' order too. The others (a client's shorter ``X-Request-Timeout-Ms``) wait
in a heap. Items answered before their deadline are not taken out one by one: they
are dropped when the timer reaches them, or all at once when the list or the heap
has doubled since it was last cleaned (so each stays about as large as the number of
waiting items).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from ._entries import Entry
from .clock import Clock, Timer

__all__ = ["DeadlineWatch"]

_SMALL = 64  # below this many, the list and the heap are never cleaned


class DeadlineWatch:
    """Calls ``expire(entry)`` once ``entry``'s deadline passes, unless its future is
    done by then.

    Args:
        clock: Where the time and the one timer come from.
        expire: Called for each entry whose deadline passed while it still waited.
    """

    def __init__(self, clock: Clock, expire: Callable[[Entry], None]) -> None:
        self._clock = clock
        self._expire = expire
        self._line: list[tuple[float, Entry]] = []  # deadlines in arrival order
        self._line_kept = 0  # its length when it was last cleaned
        self._heap: list[tuple[float, int, Entry]] = []  # the deadlines out of that order
        self._heap_kept = 0
        self._pushed = 0  # breaks ties in the heap (entries do not compare)
        self._timer: Timer | None = None
        self._timer_at = math.inf

    def __len__(self) -> int:
        """Entries held (answered ones included until they are dropped)."""
        return len(self._line) + len(self._heap)

    def watch(self, entry: Entry, deadline: float) -> None:
        """Expire ``entry`` at ``deadline`` if it still waits then."""
        line = self._line
        if not line or line[-1][0] <= deadline:
            line.append((deadline, entry))
            if len(line) > 2 * self._line_kept + _SMALL:
                self._line = line = [held for held in line if not held[1].future.done()]
                self._line_kept = len(line)
        else:
            heap = self._heap
            self._pushed += 1
            heapq.heappush(heap, (deadline, self._pushed, entry))
            if len(heap) > 2 * self._heap_kept + _SMALL:
                self._heap = heap = [held for held in heap if not held[2].future.done()]
                heapq.heapify(heap)
                self._heap_kept = len(heap)
        if deadline < self._timer_at:
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._clock.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now = self._clock.now()
        line = self._line
        passed = 0
        while passed < len(line):
            deadline, entry = line[passed]
            if not entry.future.done():
                if deadline > now:
                    break
                self._expire(entry)
            passed += 1
        del line[:passed]
        heap = self._heap
        while heap and (heap[0][0] <= now or heap[0][2].future.done()):
            entry = heapq.heappop(heap)[2]
            if not entry.future.done():
                self._expire(entry)
        due = min(line[0][0] if line else math.inf, heap[0][0] if heap else math.inf)
        if due < math.inf:
            self._arm(due)

    def close(self) -> None:
        """Stop the timer and forget every entry."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self._line.clear()
        self._heap.clear()
