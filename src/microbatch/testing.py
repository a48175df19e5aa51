"""Helpers for testing code that uses microbatch: a clock that moves only when told."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Callable

__all__ = ["FakeClock"]


class _FakeTimer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock for tests: time stands still until :meth:`advance` moves it.

    Timers set with :meth:`call_at` run inside :meth:`advance`, in time order, with
    :meth:`now` reading each timer's own time while it runs. Nothing depends on the
    wall clock, so tests of timing decisions are exact and take no real time.

    It is thread-safe: threads (the thread batcher's callers) may set timers while
    another thread advances the clock; :meth:`wait_for_timers` lets a test wait,
    without polling, until they are all waiting.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()

    def now(self) -> float:
        """The current fake time in seconds."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> _FakeTimer:
        """Run ``callback`` when the clock is advanced to ``when`` or past it (from
        the thread that advances it)."""
        timer = _FakeTimer(when, callback)
        with self._changed:
            heapq.heappush(self._timers, (when, next(self._order), timer))
            self._changed.notify_all()
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, running every timer that falls due."""
        if seconds < 0:
            raise ValueError(f"time cannot go back: advance({seconds!r})")
        target = self._now + seconds
        while True:
            with self._changed:
                # Taking the next due timer and, when none is left, setting the time
                # are one step: a timer set meanwhile is either run or already due.
                if not self._timers or self._timers[0][0] > target:
                    self._now = target
                    return
                when, _, timer = heapq.heappop(self._timers)
                if timer.cancelled:
                    continue
                self._now = max(self._now, when)
            timer.callback()

    def next_timer(self) -> float | None:
        """The time of the earliest pending timer, or ``None`` when there is none."""
        with self._changed:
            self._discard_cancelled()
            return self._timers[0][0] if self._timers else None

    def pending_timers(self) -> int:
        """How many timers wait to run (cancelled ones not counted)."""
        with self._changed:
            return sum(1 for _, _, timer in self._timers if not timer.cancelled)

    def wait_for_timers(self, count: int = 1, timeout_s: float = 10.0) -> None:
        """Block until at least ``count`` timers wait to run (threads that went to
        sleep on this clock), woken by each new timer rather than polling.

        Raises:
            TimeoutError: Not so many timers within ``timeout_s`` real seconds.
        """

        def enough() -> bool:
            return sum(1 for _, _, timer in self._timers if not timer.cancelled) >= count

        with self._changed:
            if not self._changed.wait_for(enough, timeout_s):
                raise TimeoutError(f"fewer than {count} timers after {timeout_s} s")

    def _discard_cancelled(self) -> None:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by ``seconds`` from now."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        self.call_at(self._now + seconds, wake)
        await future
