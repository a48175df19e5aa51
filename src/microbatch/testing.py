"""Helpers for testing code that uses microbatch: a clock that moves only when told."""

from __future__ import annotations

import asyncio
import heapq
import itertools
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
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """The current fake time in seconds."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> _FakeTimer:
        """Run ``callback`` when the clock is advanced to ``when`` or past it."""
        timer = _FakeTimer(when, callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, running every timer that falls due."""
        if seconds < 0:
            raise ValueError(f"time cannot go back: advance({seconds!r})")
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.callback()
        self._now = target

    def next_timer(self) -> float | None:
        """The time of the earliest pending timer, or ``None`` when there is none."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by ``seconds`` from now."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        self.call_at(self._now + seconds, wake)
        await future
