"""Batch composition: what a batch costs, and which queued items form it.

An item's *cost* is what ``cost_fn`` says it weighs (tokens, pixels, samples). A
batch's cost is ``"padded"`` — its largest per-row cost times its rows, what a
model that pads every row to the longest pays — or ``"sum"``, for ragged models.

The :class:`Composer` picks a batch's members from the queue. First-in first-out
(the default), it takes the oldest items while they fit the size and cost limits.
Grouping by cost, it looks at a window of the oldest queued items and forms the
batch around one *anchor* item from the items whose cost is nearest to its own, so
that short items do not pay for a long one's padding. The anchor is the item that
has waited longest for its cost (its wait over its cost: cheap items go soon, the
most answers per second of model time, and costly ones in their turn), unless the
oldest item has waited ``max_wait_s`` (the age bound): then the oldest is the
anchor. So no item starves: once an item is past the age bound, every batch
takes the oldest waiting item, and it goes within as many batches as there were
items queued before it.
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


def _urgency(entry: Costed, now: float) -> float:
    """How long ``entry`` waited per unit of its cost (ties: the cheapest first)."""
    return (now - entry.arrival + 1e-9) / max(entry.peak, 1e-9)


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
        min_efficiency: Grouping with padded costs: an item joins a batch only if
            the batch's useful cost stays at least this share of its padded cost
            (so a batch stops growing before it mixes short items with long ones).

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
        min_efficiency: float = 0.6,
    ) -> None:
        self.max_units = max_units
        self.max_cost = max_cost
        self.mode = mode
        self.group = group
        self.window = window
        self.max_wait_s = max_wait_s
        self.measured = measured
        self.min_efficiency = min_efficiency
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

    def _efficient(self, shape: _Shape, entry: Costed) -> bool:
        if self.mode == "sum":
            return True
        padded = max(shape.peak, entry.peak) * (shape.rows + entry.rows)
        return shape.total + entry.cost >= self.min_efficiency * padded

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
        if window[0].arrival <= now - self.max_wait_s:
            anchor = 0  # the oldest waited past the age bound: its group goes now
        else:  # the longest wait per unit of cost: cheap items soon, costly ones in time
            anchor = max(range(len(window)), key=lambda i: _urgency(window[i], now))
        order = sorted(range(len(window)), key=lambda i: window[i].peak)
        at = order.index(anchor)
        shape.add(window[anchor])
        chosen = [anchor]
        target = window[anchor].peak
        below, above = at - 1, at + 1
        while below >= 0 or above < len(order):
            take_below = above >= len(order) or (
                below >= 0
                and target - window[order[below]].peak <= window[order[above]].peak - target
            )
            side = below if take_below else above
            entry = window[order[side]]
            if self._fits(shape, entry) and self._efficient(shape, entry):
                shape.add(entry)
                chosen.append(order[side])
                if take_below:
                    below -= 1
                else:
                    above += 1
            elif take_below:
                below = -1  # the ones further out are further from the anchor's cost
            else:
                above = len(order)
        chosen.sort()
        return [window[index] for index in chosen]
