"""Admission, shared by the asyncio and the thread batcher: one item becomes queued
parts (size, ``size_fn``, rows split), or is refused at once (closed, overload,
deadline already passed), and the parts' outcomes become the caller's result.

The deadline is worked out once, by :func:`microbatch.types.deadline_from`, in the
batchers' ``submit``; nothing here or below recomputes it.

Not thread-safe: the asyncio batcher uses it from its loop, the thread batcher under
its lock (except :meth:`Intake.parts`, which reads only the settings).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._queue import Pending, PendingQueue
from .config import BatchConfig
from .errors import BatcherClosed, DeadlineExceeded, ItemTooLarge, Overloaded
from .merge import split_rows
from .types import deadline_from

__all__ = ["Intake"]

E = TypeVar("E", bound=Pending)


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
        self.queue: PendingQueue[E] = PendingQueue(config.max_batch_size)
        self.state = self.queue.state
        self.stats = self.queue.stats
        self.closing = False
        self.now = now
        # One item without size, rows or default timeout needs nothing worked out.
        self.plain = self.rows is None and config.size_fn is None and config.timeout_s is None

    def deadline(self, timeout_s: float | None, deadline: float | None) -> float | None:
        """The deadline of an item submitted now (see :func:`deadline_from`)."""
        return deadline_from(
            timeout_s, deadline, default_timeout_s=self.config.timeout_s, now=self.now
        )

    def parts(self, item: Any) -> list[tuple[Any, int]]:
        """``item`` as queued parts ``[(part, units)]``: several only with rows.

        Raises:
            ItemTooLarge: Without rows, the item is larger than ``max_batch_size``.
            ValueError: ``size_fn`` returned something other than an int >= 1.
        """
        config = self.config
        if self.rows is not None:
            return split_rows(self.rows, item, config.max_batch_size)
        size_fn = config.size_fn
        if size_fn is None:
            return [(item, 1)]
        size = size_fn(item)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size_fn must return an int >= 1, got {size!r}")
        if size > config.max_batch_size:
            raise ItemTooLarge(
                f"item of size {size} exceeds max_batch_size={config.max_batch_size}"
            )
        return [(item, size)]

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
