"""The queue of items waiting for a batch, shared by the asyncio and thread batchers.

Entries leave the queue in order, in batches of at most ``max_batch_size`` units.
A cancelled or expired entry is only marked: it is skipped when reached, which keeps
removal O(1); the queue is compacted when such entries pile up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

from .policy import QueueState
from .stats import StatsRecorder

__all__ = ["Pending", "PendingQueue"]


class Pending:
    """What the queue needs of an entry; each batcher's entry extends it."""

    __slots__ = ("arrival", "queued", "size")

    def __init__(self, size: int, arrival: float) -> None:
        self.size = size
        self.arrival = arrival
        self.queued = True


E = TypeVar("E", bound=Pending)


class PendingQueue(Generic[E]):
    """FIFO of pending entries, with the state a policy reads and the batcher's stats.

    Not thread-safe: the asyncio batcher uses it from its loop, the thread batcher
    under its lock.
    """

    def __init__(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self.state = QueueState()
        self.stats = StatsRecorder()
        self._entries: deque[E] = deque()

    def __iter__(self) -> Iterator[E]:
        """The entries still queued, oldest first."""
        return (entry for entry in self._entries if entry.queued)

    def add(self, entry: E, now: float) -> None:
        """Queue ``entry``, which arrived at ``now``."""
        self._entries.append(entry)
        self.state.arrived(now, entry.size)

    def drop(self, entry: E) -> None:
        """Take a queued entry out of the counts; it is skipped when reached."""
        entry.queued = False
        state = self.state
        state.left(entry.size)
        if len(self._entries) > 2 * state.count + 64:
            self._entries = deque(e for e in self._entries if e.queued)

    def head(self) -> E | None:
        """The oldest queued entry (``state.oldest_arrival_s`` is set from it)."""
        entries = self._entries
        while entries and not entries[0].queued:
            entries.popleft()
        if not entries:
            return None
        head = entries[0]
        self.state.oldest_arrival_s = head.arrival
        return head

    def take(self, now: float) -> tuple[list[E], int]:
        """Remove the next batch: the oldest entries up to ``max_batch_size`` units.

        Stops at the first entry that does not fit, so the order is kept.
        """
        entries, limit = self._entries, self.max_batch_size
        batch: list[E] = []
        units = 0
        while entries:
            entry = entries[0]
            if not entry.queued:
                entries.popleft()
                continue
            if units + entry.size > limit:
                break
            entries.popleft()
            entry.queued = False
            batch.append(entry)
            units += entry.size
        self.state.released(len(batch), units)
        self.stats.released(units, [now - entry.arrival for entry in batch])
        return batch, units
