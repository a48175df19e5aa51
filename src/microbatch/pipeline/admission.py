"""What a Service counts on every item, compiled (``hatch_build.py``): the items
inside it against its bound, whether it drains, the routes whose items are queued
at once (:meth:`~microbatch.Service.submit_nowait`, the HTTP front's path for a
one-stage route), and those whose items stream from one step-wise stage
(:meth:`~microbatch.Service.stream`).

The Service stays interpreted (its public methods keep their docstrings); what it
does per item lives here, so that a request runs no interpreted code between the
front and the batcher's queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from .._queueing import BatchQueueing
from ..timing import Timing

__all__ = ["Admission", "NowaitLane", "StreamLane"]


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


class _Streaming(Protocol):
    """A step-wise stage's step loops, as a lane opens a stream on them."""

    @property
    def alive(self) -> int:
        """Workers able to take a stream now."""

    def open(
        self,
        item: Any,
        *,
        deadline: float | None = None,
        first_chunk_deadline: float | None = None,
        on_end: Callable[[Any], None] | None = None,
    ) -> AsyncIterator[Any]:
        """Open the stream of ``item``."""


class StreamLane:
    """A route whose items stream from one step-wise stage, opened at once.

    Args:
        admission: The service's count of items inside.
        streaming: The stage's step loops.
        refuse: Raises why the service cannot take an item now (its ``_admit``).
    """

    def __init__(
        self, admission: Admission, streaming: _Streaming, refuse: Callable[[], Any]
    ) -> None:
        self.admission = admission
        self.streaming = streaming
        self._refuse = refuse
        self._ended = self._left  # one bound method, not one per stream

    def open(
        self, item: Any, deadline: float | None, first_chunk_deadline: float | None
    ) -> AsyncIterator[Any]:
        """Open the stream of ``item`` now; it counts as inside until it ends.

        Raises:
            As :meth:`~microbatch.Service.stream`, at once (nothing was opened).
        """
        admission = self.admission
        if admission.draining or admission.full() or not self.streaming.alive:
            self._refuse()  # raises the refusal
        admission.entered()
        try:
            return self.streaming.open(
                item,
                deadline=deadline,
                first_chunk_deadline=first_chunk_deadline,
                on_end=self._ended,
            )
        except BaseException:
            admission.left()
            raise

    def _left(self, stream: object) -> None:
        self.admission.left()
