"""Every waiting item's deadline on one timer: the earliest.

A batcher used to set a timer per item (about 3 us of CPU to set and cancel on
uvloop, for nearly every HTTP request: each one has a deadline). Here the items'
deadlines wait in a heap and one timer is armed for the earliest; when it fires,
every item past its deadline that still waits is expired, and the timer is armed
for the next. Items answered before their deadline are not taken out one by one:
they are dropped when they reach the top, or all at once when the heap has doubled
since it was last cleaned (so it stays about as large as the number of waiting
items).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from .clock import Clock, Timer

__all__ = ["DeadlineWatch"]


class _Waiting(Protocol):
    """An item with the future its caller awaits."""

    @property
    def future(self) -> asyncio.Future[Any]: ...


E = TypeVar("E", bound=_Waiting)

_SMALL = 64  # below this many, the heap is never cleaned


class DeadlineWatch(Generic[E]):
    """Calls ``expire(entry)`` once ``entry``'s deadline passes, unless its future is
    done by then.

    Args:
        clock: Where the time and the one timer come from.
        expire: Called for each entry whose deadline passed while it still waited.
    """

    def __init__(self, clock: Clock, expire: Callable[[E], None]) -> None:
        self._clock = clock
        self._expire = expire
        self._heap: list[tuple[float, int, E]] = []
        self._order = itertools.count()
        self._timer: Timer | None = None
        self._timer_at = math.inf
        self._cleaned_size = 0

    def __len__(self) -> int:
        """Entries held (answered ones included until they are dropped)."""
        return len(self._heap)

    def watch(self, entry: E, deadline: float) -> None:
        """Expire ``entry`` at ``deadline`` if it still waits then."""
        heap = self._heap
        heapq.heappush(heap, (deadline, next(self._order), entry))
        if len(heap) > 2 * self._cleaned_size + _SMALL:
            self._clean()
        if deadline < self._timer_at:
            self._arm(deadline)

    def _clean(self) -> None:
        """Drop the entries already answered."""
        self._heap = [held for held in self._heap if not held[2].future.done()]
        heapq.heapify(self._heap)
        self._cleaned_size = len(self._heap)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._clock.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        heap = self._heap
        now = self._clock.now()
        while heap and (heap[0][0] <= now or heap[0][2].future.done()):
            _, _, entry = heapq.heappop(heap)
            if not entry.future.done():
                self._expire(entry)
        if heap:
            self._arm(heap[0][0])

    def close(self) -> None:
        """Stop the timer and forget every entry."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self._heap.clear()
