"""Time as a parameter: the clock the batchers read and set timers on.

Deadlines and arrival times are ``time.monotonic()`` seconds. Tests pass a
:class:`microbatch.testing.FakeClock` instead, which makes timing decisions exact and
instant.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "MonotonicClock", "Timer"]


class Timer(Protocol):
    """A scheduled callback that can be called off."""

    def cancel(self) -> None:
        """Do not run the callback (no effect if it already ran)."""


class Clock(Protocol):
    """Reads the time and runs callbacks at a given time."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` at time ``when`` (on this clock's scale) in the running loop.

        The thread batcher sets timers from its callers' threads on a clock other
        than :class:`MonotonicClock` (a FakeClock): there, callbacks may run in any
        thread."""


class MonotonicClock:
    """The real clock: ``time.monotonic()`` and the running asyncio loop's timers."""

    __slots__ = ()

    def now(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Schedule ``callback`` on the running event loop at monotonic time ``when``."""
        delay = when - time.monotonic()
        return asyncio.get_running_loop().call_later(delay if delay > 0 else 0, callback)
