"""Batch composition: what a batch costs, and which queued items form it.

An item's *cost* is what ``cost_fn`` says it weighs (tokens, pixels, samples). A
batch's cost is ``"padded"`` — its largest per-row cost times its rows, what a
model that pads every row to the longest pays — or ``"sum"``, for ragged models.

The :class:`Composer` picks a batch's members from the queue. First-in first-out
(the default), it takes the oldest items while they fit the size and cost limits.
Grouping by cost, it looks at a window of the oldest queued items and forms the
batch around the oldest one from the items whose cost is nearest to its own, so
that short items do not pay for a long one's padding. No item starves: the oldest
queued item is always in the next batch, and items that waited ``max_wait_s``
(the age bound) go first, in arrival order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, Protocol, TypeVar

__all__ = ["BatchCostMode", "Composer", "Costed", "batch_cost"]

BatchCostMode = Literal["padded", "sum"]


class Costed(Protocol):
    """What the composer reads of a queued entry."""

    size: int  # batch units (items, rows or size_fn units)
    cost: float  # the entry's cost: the sum over its rows
    peak: float  # its largest per-row cost
    rows: int  # its rows (1 for an item that is not a sequence of rows)
    arrival: float


def batch_cost(entries: Iterable[Costed], mode: BatchCostMode) -> float:
    """The cost of a batch of ``entries``: padded (largest per-row cost times the
    rows) or the sum of their costs."""
    if mode == "sum":
        return float(sum(entry.cost for entry in entries))
    peak, rows = 0.0, 0
    for entry in entries:
        peak = max(peak, entry.peak)
        rows += entry.rows
    return peak * rows


E = TypeVar("E", bound=Costed)


class _Shape:
    """Running totals of a batch being formed."""

    __slots__ = ("mode", "peak", "rows", "total", "units")

    def __init__(self, mode: BatchCostMode) -> None:
        self.mode = mode
        self.units = 0
        self.rows = 0
        self.total = 0.0
        self.peak = 0.0

    def cost_with(self, entry: Costed) -> float:
        """The batch's cost if ``entry`` joined it."""
        if self.mode == "sum":
            return self.total + entry.cost
        return max(self.peak, entry.peak) * (self.rows + entry.rows)

    def add(self, entry: Costed) -> None:
        self.units += entry.size
        self.rows += entry.rows
        self.total += entry.cost
        self.peak = max(self.peak, entry.peak)

    @property
    def cost(self) -> float:
        return self.total if self.mode == "sum" else self.peak * self.rows


class Composer:
    """Chooses the members of the next batch (see the module docstring).

    Args:
        max_units: Most batch units (``max_batch_size``).
        max_cost: Most cost per batch (``max_batch_cost``), or None.
        mode: How a batch's cost is counted: ``"padded"`` or ``"sum"``.
        group: Group items of similar cost (else first-in first-out).
        window: How many of the oldest queued items grouping chooses from.
        max_wait_s: The age bound: items queued this long go first, oldest first.
        measured: Items' costs come from a ``cost_fn`` (else each costs its units).

    ``ceiling`` is a further cost limit the batcher learns from out-of-memory errors
    (None: none learned). A batch always holds at least its first item, even one
    that costs more than the ceiling (it then runs alone).
    """

    def __init__(
        self,
        max_units: int,
        max_cost: float | None = None,
        mode: BatchCostMode = "sum",
        *,
        group: bool = False,
        window: int = 256,
        max_wait_s: float = 1.0,
        measured: bool = False,
    ) -> None:
        self.max_units = max_units
        self.max_cost = max_cost
        self.mode = mode
        self.group = group
        self.window = window
        self.max_wait_s = max_wait_s
        self.measured = measured
        self.ceiling: float | None = None

    @property
    def cost_limit(self) -> float | None:
        """The cost limit of the next batch: the budget or the learned ceiling."""
        budget, ceiling = self.max_cost, self.ceiling
        if ceiling is None:
            return budget
        return ceiling if budget is None else min(budget, ceiling)

    def choose(self, queued: Iterable[E], now: float) -> list[E]:
        """The next batch from ``queued`` (oldest first), in arrival order."""
        if not self.group:
            return self._first_in_first_out(queued)
        window: list[E] = []
        for entry in queued:
            window.append(entry)
            if len(window) >= self.window:
                break
        return self._grouped(window, now)

    def _fits(self, shape: _Shape, entry: Costed) -> bool:
        if not shape.units:
            return True  # the first item always goes, whatever it costs
        if shape.units + entry.size > self.max_units:
            return False
        limit = self.cost_limit
        return limit is None or shape.cost_with(entry) <= limit

    def _first_in_first_out(self, queued: Iterable[E]) -> list[E]:
        shape = _Shape(self.mode)
        batch: list[E] = []
        for entry in queued:
            if not self._fits(shape, entry):
                break
            shape.add(entry)
            batch.append(entry)
        return batch

    def _grouped(self, window: Sequence[E], now: float) -> list[E]:
        shape = _Shape(self.mode)
        chosen: list[int] = []
        overdue = now - self.max_wait_s
        start = 0
        for index, entry in enumerate(window):
            if entry.arrival > overdue:
                break
            if not self._fits(shape, entry):
                return list(window[:index])
            shape.add(entry)
            chosen.append(index)
            start = index + 1
        rest = range(start, len(window))
        if not rest:
            return list(window[:start])
        anchor = start  # the oldest item not yet chosen: the group forms around it
        order = sorted(rest, key=lambda i: window[i].peak)
        at = order.index(anchor)
        if not self._fits(shape, window[anchor]):
            return list(window[:start])
        shape.add(window[anchor])
        chosen.append(anchor)
        target = window[anchor].peak
        below, above = at - 1, at + 1
        while below >= 0 or above < len(order):
            take_below = above >= len(order) or (
                below >= 0
                and target - window[order[below]].peak <= window[order[above]].peak - target
            )
            side = below if take_below else above
            entry = window[order[side]]
            if self._fits(shape, entry):
                shape.add(entry)
                chosen.append(order[side])
                if take_below:
                    below -= 1
                else:
                    above += 1
            elif take_below:
                below = -1  # cheaper ones fit no better (padded) or the budget is near
            else:
                above = len(order)
        chosen.sort()
        return [window[index] for index in chosen]
