"""The asyncio batcher's queued items: an entry per item (its future, its deadline
timer, its place in the batch at the runner), and whether its caller still waits."""

from __future__ import annotations

import asyncio
from typing import Any

from ._queue import Pending
from .clock import Timer
from .timing import Timing
from .types import BatchJob

__all__ = ["Entry", "wanted"]


class Entry(Pending):
    """One queued item, its deadline and the future its caller awaits."""

    __slots__ = ("deadline", "future", "index", "item", "job", "timer", "timing")

    def __init__(
        self,
        item: Any,
        size: int,
        arrival: float,
        future: asyncio.Future[Any],
        deadline: float | None,
    ) -> None:
        super().__init__(size, arrival)
        self.item = item
        self.future = future
        self.deadline = deadline
        self.timer: Timer | None = None
        self.job: BatchJob | None = None  # while its batch is at the runner
        self.index = 0  # its place in that batch
        self.timing: Timing | None = None  # the caller's record, when it wants one

    def unwanted(self) -> None:
        """Tell the runner holding this entry's batch that nobody waits for it."""
        job = self.job
        if job is not None and job.on_unwanted is not None:
            job.on_unwanted(self.index)


def wanted(batch: list[Entry], index: int) -> bool:
    """Whether item ``index``'s caller still waits (not cancelled, not expired)."""
    return not batch[index].future.done()
