"""The callers waiting in the thread batcher: a blocked thread or an awaiting
asyncio caller, and their queued entries."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ._queue import Pending
from .timing import Timing

__all__ = ["PENDING", "Call", "Entry", "LoopCall", "ThreadCall"]

PENDING: Any = object()
"""The outcome of an entry not settled yet."""


class Call:
    """One caller's request: its items (several parts with rows) and its deadline."""

    __slots__ = ("deadline", "entries", "pending")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.entries: list[Entry] = []
        self.pending = 0


class ThreadCall(Call):
    """A caller blocked in :meth:`CooperativeBatcher.submit`.

    The wake-up is a lock that stays held; "armed" while the caller waits on it.
    Whoever settles the call or hands it the lead releases it once, under the
    batcher's lock. The caller sleeps on it without holding the batcher's lock, so a
    settled caller returns at once instead of queueing for that lock.
    """

    __slots__ = ("armed", "signal")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline  # Call's fields, set here: this is on every call's path
        self.entries = []
        self.pending = 0
        self.signal = threading.Lock()
        self.signal.acquire()
        self.armed = False

    def wake(self) -> None:
        """Wake the caller (batcher lock held); a no-op unless it is waiting."""
        if self.armed:
            self.armed = False
            self.signal.release()

    def sleep(self, lock: threading.Lock, timeout_s: float | None) -> None:
        """Wait until woken or ``timeout_s`` passed (None: no limit), with the
        batcher's ``lock`` released meanwhile (held on entry and on return)."""
        self.armed = True
        woken = False
        lock.release()
        try:
            if timeout_s is None:
                woken = self.signal.acquire()
            else:
                woken = self.signal.acquire(True, max(timeout_s, 0.0))
        finally:
            lock.acquire()
            self._disarm(woken)

    def _disarm(self, woken: bool) -> None:
        """After a wait (batcher lock held): the signal is held again, not armed."""
        if self.armed:
            self.armed = False  # timed out and nobody woke us: still held
        elif not woken:
            self.signal.acquire()  # woken just after timing out: take it back


class LoopCall(Call):
    """A caller awaiting in :meth:`CooperativeBatcher.asubmit` on ``loop``."""

    __slots__ = ("answered", "future", "loop", "timing")

    def __init__(self, deadline: float | None, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(deadline)
        self.loop = loop
        self.timing: Timing | None = None  # the caller's record, when it wants one
        self.future: asyncio.Future[Any] = loop.create_future()
        self.answered = False


class Entry(Pending):
    __slots__ = ("call", "item", "outcome")

    def __init__(self, call: Call, item: Any, size: int, arrival: float) -> None:
        super().__init__(size, arrival)
        self.call = call
        self.item = item
        self.outcome: Any = PENDING
