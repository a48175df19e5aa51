"""The queue of items waiting for a batch, shared by the asyncio and thread batchers.

Entries leave the queue in batches that the :class:`~microbatch.composition.Composer`
chooses: in order, or grouped by cost from a window of the oldest. An entry that
left (cancelled, expired, or taken out of the middle by grouping) is only marked:
it is skipped when reached, which keeps removal O(1); the queue is compacted when
such entries pile up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

from mypy_extensions import mypyc_attr

from ._queue_state import QueueState
from .composition import Composer, batch_cost
from .stats import StatsRecorder

__all__ = ["Pending", "PendingQueue"]


@mypyc_attr(allow_interpreted_subclasses=True)  # other entries extend it
class Pending:
    """What the queue needs of an entry; each batcher's entry extends it.

    ``cost`` (the sum over its rows), ``peak`` (its largest per-row cost) and
    ``rows`` are what ``cost_fn`` measured; without one, an entry costs its size.
    """

    __slots__ = ("arrival", "cost", "peak", "queued", "rows", "size")

    def __init__(self, size: int, arrival: float) -> None:
        self.size = size
        self.arrival = arrival
        self.queued = True
        self.cost = self.peak = float(size)
        self.rows = 1


E = TypeVar("E", bound=Pending)


class PendingQueue(Generic[E]):
    """FIFO of pending entries, with the state a policy reads and the batcher's stats.

    Not thread-safe: the asyncio batcher uses it from its loop, the thread batcher
    under its lock.
    """

    def __init__(self, composer: Composer) -> None:
        self.composer = composer
        self.state = QueueState()
        self.stats = StatsRecorder()
        self._entries: deque[E] = deque()

    def __iter__(self) -> Iterator[E]:
        """The entries still queued, oldest first."""
        return (entry for entry in self._entries if entry.queued)

    def add(self, entry: E, now: float) -> None:
        """Queue ``entry``, which arrived at ``now``."""
        self._entries.append(entry)
        self.state.arrived(now, entry.size, entry.cost)

    def drop(self, entry: E) -> None:
        """Take a queued entry out of the counts; it is skipped when reached."""
        entry.queued = False
        state = self.state
        state.left(entry.size, entry.cost)
        self._compact()

    def _compact(self) -> None:
        if len(self._entries) > 2 * self.state.count + 64:
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

    def take(self, now: float, limit: int | None = None) -> tuple[list[E], int]:
        """Remove the next batch, as the composer chooses it; return it and its units.

        Args:
            now: The time of the release.
            limit: Fewer units than ``max_units`` for this batch (a policy's
                :attr:`~microbatch.AdaptivePolicy.batch_limit`), or None. Composed
                batches (grouping, a cost budget) keep to their own limits.
        """
        composer = self.composer
        if composer.group or composer.cost_limit is not None:
            return self._take_composed(now)
        entries = self._entries
        limit = composer.max_units if limit is None else min(limit, composer.max_units)
        batch: list[E] = []
        units = 0
        while entries:
            entry = entries[0]
            if not entry.queued:
                entries.popleft()
                continue
            if units + entry.size > limit and batch:
                break
            entries.popleft()
            entry.queued = False
            batch.append(entry)
            units += entry.size
        self._released(batch, units, now)
        return batch, units

    def _take_composed(self, now: float) -> tuple[list[E], int]:
        batch = self.composer.choose(iter(self), now)
        units = 0
        for entry in batch:
            entry.queued = False
            units += entry.size
        self.head()  # drop what left from the front
        self._compact()
        self._released(batch, units, now)
        return batch, units

    def _released(self, batch: list[E], units: int, now: float) -> None:
        measured = self.composer.measured
        # Without a cost_fn each entry costs its units.
        cost = sum(entry.cost for entry in batch) if measured else float(units)
        self.state.released(len(batch), units, cost)
        self.stats.released(units, [now - entry.arrival for entry in batch])
        if measured:
            self.stats.costed(batch_cost(batch, self.composer.mode), cost)
