"""What a Service counts on every item, compiled (``hatch_build.py``): the items
inside it against its bound, whether it drains, and the routes whose items are queued
at once (:meth:`~microbatch.Service.submit_nowait`, the HTTP front's path for a
one-stage route).

The Service stays interpreted (its public methods keep their docstrings); what it
does per item lives here, so that a request runs no interpreted code between the
front and the batcher's queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from .._queueing import BatchQueueing
from ..timing import Timing

__all__ = ["Admission", "NowaitLane"]


class Admission:
    """The items inside a service: counted in when admitted, out when they leave.

    Args:
        bound: Most items inside at once (the service's ``max_in_flight``).
    """

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.inside = 0
        self.draining = False
        self.emptied: asyncio.Event | None = None  # set when the last item leaves

    def full(self) -> bool:
        """Whether one more item would be over the bound."""
        return self.inside >= self.bound

    def entered(self) -> None:
        """One item was admitted."""
        self.inside += 1

    def left(self) -> None:
        """One item left (answered, failed or withdrawn)."""
        self.inside -= 1
        if not self.inside and self.emptied is not None:
            self.emptied.set()


class _Alive(Protocol):
    """A stage's workers, as a lane asks about them."""

    @property
    def alive(self) -> int:
        """Workers that can take a batch now."""


class NowaitLane:
    """A route whose items go straight to one stage's batcher, queued at once.

    Args:
        admission: The service's count of items inside.
        batcher: The stage's batcher (it ``accepts_nowait``).
        pool: The stage's workers.
        stage: The stage's name (each item's timing record names it).
        refuse: Raises why the service cannot take an item now (its ``_admit``).
    """

    def __init__(
        self,
        admission: Admission,
        batcher: BatchQueueing,
        pool: _Alive,
        stage: str,
        refuse: Callable[[], Any],
    ) -> None:
        self.admission = admission
        self.batcher = batcher
        self.pool = pool
        self.stage = stage
        self._refuse = refuse
        self._left = admission.left  # one bound method, not one per item

    def submit(
        self, item: Any, deadline: float | None, timing: Timing | None
    ) -> asyncio.Future[Any]:
        """Queue ``item`` now: its result's future (cancelling it withdraws the item).

        Raises:
            As :meth:`~microbatch.Service.submit`, at once (nothing was queued).
        """
        admission = self.admission
        if admission.draining or admission.full() or not self.pool.alive:
            self._refuse()  # raises the refusal
        if timing is not None:
            timing.stage = self.stage
        # BatchQueueing's own method, called directly (the Batcher is interpreted)
        future = BatchQueueing.queue_nowait(self.batcher, item, deadline, timing, self._left)
        admission.entered()
        return future
