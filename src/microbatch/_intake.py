"""Admission, shared by the asyncio and the thread batcher: one item becomes queued
parts (size, ``size_fn``, cost, rows split), or is refused at once (closed, overload,
deadline already passed, over the cost budget), and the parts' outcomes become the
caller's result. After each batch the intake learns from it: its shape for the
policy, and the cost ceiling from its out-of-memory errors.

The deadline is worked out once, by :func:`microbatch.types.deadline_from`, in the
batchers' ``submit``; nothing here or below recomputes it.

Not thread-safe: the asyncio batcher uses it from its loop, the thread batcher under
its lock (except :meth:`Intake.parts`, which reads only the settings).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from ._queue import Pending, PendingQueue
from .composition import batch_cost
from .config import BatchConfig
from .errors import BatcherClosed, DeadlineExceeded, ItemTooLarge, Overloaded
from .merge import RowFormat, split_rows
from .oom import CostCeiling, MemorySplits
from .types import deadline_from

__all__ = ["Intake", "Part"]

E = TypeVar("E", bound=Pending)


class Part(NamedTuple):
    """One queued part of an item: the item itself, or some of its rows.

    ``cost`` is the sum of its rows' costs, ``peak`` the largest one (both its
    ``units`` without ``cost_fn``), ``rows`` its row count (1 without rows).
    """

    item: Any
    units: int
    cost: float
    peak: float
    rows: int

    def measure(self, entry: Pending) -> None:
        """Give the queue entry of this part its cost."""
        entry.cost, entry.peak, entry.rows = self.cost, self.peak, self.rows


class Intake(Generic[E]):
    """A batcher's intake: its settings resolved, its policy, its one queue.

    Args:
        config: The batching settings.
        now: The clock (``time.monotonic`` scale).
    """

    def __init__(self, config: BatchConfig, now: Callable[[], float]) -> None:
        self.config = config
        self.rows = config.row_format()
        self.policy = config.new_policy()
        self.composer = config.new_composer()
        self.queue: PendingQueue[E] = PendingQueue(self.composer)
        self.state = self.queue.state
        self.stats = self.queue.stats
        self.ceiling = CostCeiling()
        self.closing = False
        self.now = now
        # One item without size, cost, rows or default timeout needs nothing worked out.
        self.plain = (
            self.rows is None
            and config.size_fn is None
            and config.cost_fn is None
            and config.timeout_s is None
        )
        self._learn_shape = getattr(self.policy, "batch_cost_finished", None)

    def memory_splits(self) -> MemorySplits | None:
        """A fresh record of one batch's out-of-memory splits (None: no splitting)."""
        if not self.config.split_on_oom:
            return None
        return MemorySplits(self.config.oom_errors)

    def finished(
        self,
        batch: Sequence[Pending],
        out_of_memory: Iterable[Sequence[int]],
        duration_s: float | None,
    ) -> None:
        """Learn from a finished batch: ``out_of_memory`` holds the spans of it (as
        positions) that ran out of memory; ``duration_s`` its run time, if it ran."""
        mode = self.composer.mode
        ceiling = self.ceiling
        spans = list(out_of_memory)
        if spans:
            count = len(batch)
            for span in spans:  # a runner's report: trusted no further than its range
                failed = [batch[i] for i in span if 0 <= i < count]
                if len(failed) > 1:
                    ceiling.ran_out(batch_cost(failed, mode))
            self.stats.oom_splits += len(spans)
        elif ceiling.value is not None and duration_s is not None:
            ceiling.succeeded(batch_cost(batch, mode))
        self.composer.ceiling = self.stats.cost_ceiling = ceiling.value
        learn = self._learn_shape
        if learn is not None and duration_s is not None and self.composer.measured and not spans:
            total = sum(entry.cost for entry in batch)
            learn(len(batch), batch_cost(batch, mode), total, duration_s)

    def deadline(self, timeout_s: float | None, deadline: float | None) -> float | None:
        """The deadline of an item submitted now (see :func:`deadline_from`)."""
        return deadline_from(
            timeout_s, deadline, default_timeout_s=self.config.timeout_s, now=self.now
        )

    def parts(self, item: Any) -> list[Part]:
        """``item`` as queued parts: several only with rows.

        Raises:
            ItemTooLarge: Without rows, the item is larger than ``max_batch_size``
                or costs more than ``max_batch_cost``; with rows, one row does.
            ValueError: ``size_fn`` returned something other than an int >= 1, or
                ``cost_fn`` something other than a finite number >= 0.
        """
        config = self.config
        if self.rows is not None:
            if config.cost_fn is not None:
                return self._costed_rows(self.rows, item)
            return [
                Part(part, units, float(units), float(units), units)
                for part, units in split_rows(self.rows, item, config.max_batch_size)
            ]
        size_fn = config.size_fn
        size = 1 if size_fn is None else size_fn(item)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size_fn must return an int >= 1, got {size!r}")
        if size > config.max_batch_size:
            raise ItemTooLarge(
                f"item of size {size} exceeds max_batch_size={config.max_batch_size}"
            )
        if config.cost_fn is None:
            return [Part(item, size, float(size), float(size), 1)]
        cost = self._cost_of(item)
        budget = config.max_batch_cost
        if budget is not None and cost > budget:
            raise ItemTooLarge(f"item of cost {cost:g} exceeds max_batch_cost={budget:g}")
        return [Part(item, size, cost, cost, 1)]

    def _cost_of(self, item: Any) -> float:
        cost = self.config.cost_fn(item)  # type: ignore[misc]
        if (
            isinstance(cost, bool)
            or not isinstance(cost, (int, float))
            or not (0 <= cost < math.inf)
        ):
            raise ValueError(f"cost_fn must return a finite number >= 0, got {cost!r}")
        return float(cost)

    def _costed_rows(self, rows: RowFormat, item: Any) -> list[Part]:
        """Cut ``item`` into parts that each fit ``max_batch_size`` rows and
        ``max_batch_cost`` (counted padded or summed)."""
        config = self.config
        costs = [self._cost_of(row) for row in item]
        if not costs:
            return [Part(item, 1, 0.0, 0.0, 1)]
        limit, budget, padded = config.max_batch_size, config.max_batch_cost, config.cost_mode
        bounds: list[tuple[int, float, float]] = []  # (stop, cost, peak) of each part
        start, total, peak = 0, 0.0, 0.0
        for index, cost in enumerate(costs):
            if budget is not None and cost > budget:
                raise ItemTooLarge(
                    f"row {index} of cost {cost:g} exceeds max_batch_cost={budget:g}"
                )
            count = index - start + 1
            grown = max(peak, cost) * count if padded == "padded" else total + cost
            if count > 1 and (count > limit or (budget is not None and grown > budget)):
                bounds.append((index, total, peak))
                start, total, peak = index, 0.0, 0.0
            total += cost
            peak = max(peak, cost)
        bounds.append((len(costs), total, peak))
        if len(bounds) == 1:
            return [Part(item, len(costs), total, peak, len(costs))]
        parts, begin = [], 0
        for stop, cost, top in bounds:
            parts.append(Part(rows.cut(item, begin, stop), stop - begin, cost, top, stop - begin))
            begin = stop
        return parts

    def admit(self, parts: int, deadline: float | None) -> float:
        """Check that ``parts`` more parts may be queued now; return now.

        Raises:
            BatcherClosed: The batcher is closing.
            Overloaded: The queue has no room for them (counted as rejected).
            DeadlineExceeded: The deadline has passed already (counted as expired).
        """
        if self.closing:
            raise BatcherClosed("the batcher is closed")
        count = self.state.count
        if count + parts > self.config.max_queue:
            self.stats.rejected += 1
            if parts > 1:
                room = self.config.max_queue - count
                raise Overloaded(f"the queue has room for {room} parts, the item needs {parts}")
            raise Overloaded(f"the queue is full ({count} items waiting)")
        now = self.now()
        if deadline is not None and deadline <= now:
            self.stats.expired += 1
            raise DeadlineExceeded("the deadline passed before the item was queued")
        return now

    def result(self, outcomes: list[Any]) -> Any:
        """The caller's result from its parts' outcomes (in order); raises the
        first part's error."""
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        if self.rows is not None and len(outcomes) > 1:
            return self.rows.join(outcomes)
        return outcomes[0]
