"""How the asyncio batcher queues a caller's item, and lets one go: the callers' hot
half of :class:`~microbatch.batcher.Batcher`, a base class between it and
:class:`~microbatch._release.BatchRelease`, compiled with the hot path (every
request passes here once).

It admits one item (or refuses it at once), binds the batcher to the running event
loop, queues the item with its deadline watched, and asks for a release; it
withdraws the item of a caller that left, and fails the one whose deadline passed.
The batcher's ``__init__`` sets every attribute declared here. Methods are called
as ``BatchQueueing._name(self, ...)`` (see :class:`~microbatch._release.BatchRelease`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from mypy_extensions import mypyc_attr

from ._deadlines import DeadlineWatch
from ._entries import Entry as _Entry
from ._intake import Part
from ._release import BatchRelease
from .errors import DeadlineExceeded
from .timing import Timing

__all__ = ["BatchQueueing"]


@mypyc_attr(allow_interpreted_subclasses=True)  # the Batcher extends it
class BatchQueueing(BatchRelease):
    """Queues callers' items and lets them go (see the module's docstring)."""

    _deadlines: DeadlineWatch
    _loop_ref: weakref.ref[asyncio.AbstractEventLoop] | None
    _max_queue: int

    def queue_nowait(
        self,
        item: Any,
        deadline: float | None,
        timing: Timing | None,
        on_settled: Callable[[], None] | None,
    ) -> asyncio.Future[Any]:
        """:meth:`~microbatch.batcher.Batcher.submit_nowait` without its check of
        :attr:`~microbatch.batcher.Batcher.accepts_nowait`, for a caller that checked
        it once (a Service's routes): queue one plain item now; its future
        (``on_settled()`` is called once it is done, from the batcher's own callback:
        one callback per item, not two)."""
        entry = BatchQueueing._enqueue_plain(self, item, deadline)
        entry.timing = timing
        # A function, not the bound method: no attribute lookup through the Batcher.
        entry.future.add_done_callback(partial(_settled, self, entry, on_settled))
        return entry.future

    def _enqueue_plain(self, item: Any, deadline: float | None) -> _Entry:
        """Admit and queue one item of one unit (a plain intake)."""
        loop = BatchQueueing._bind(self)
        now = self._now()
        if (
            self._intake.closing
            or self._state.count >= self._max_queue
            or (deadline is not None and deadline <= now)
        ):
            self._intake.admit(1, deadline)  # raises BatcherClosed, Overloaded or expired
        return BatchQueueing._enqueue(self, loop, item, 1, deadline, None, now)

    def _enqueue(
        self,
        loop: asyncio.AbstractEventLoop,
        item: Any,
        size: int,
        deadline: float | None,
        part: Part | None = None,
        now: float | None = None,
    ) -> _Entry:
        """Queue one admitted part (``part`` gives its cost, when one was measured)."""
        if now is None:
            now = self._now()
        entry = _Entry(item, size, now, loop.create_future(), deadline)
        if part is not None:
            part.measure(entry)
        if deadline is not None:
            self._deadlines.watch(entry, deadline)  # one timer for every item's deadline
        self._queue.add(entry, now)
        if BatchRelease._may_release(self):
            if self._state.size >= self.config.max_batch_size:
                BatchRelease._dispatch(self)
            else:
                # Ask the policy once the loop has taken every request that came in
                # with this one (the same round of I/O), not once per arrival, so the
                # next batch holds the whole round.
                BatchRelease._dispatch_at_round_end(self, loop)
        return entry

    def _bind(self) -> asyncio.AbstractEventLoop:
        """Belong to the running loop: the first to submit, or any once that one is gone."""
        loop = asyncio.get_running_loop()
        ref = self._loop_ref
        if ref is None or ref() is not loop:
            if ref is not None and ref() is not None:
                raise RuntimeError("this Batcher belongs to another event loop; make one per loop")
            self._loop_ref = weakref.ref(loop)
        return loop

    def _abandon(self, entry: _Entry) -> None:
        """The caller stopped waiting."""
        if entry.queued:
            self._stats.cancelled += 1
            BatchQueueing._drop(self, entry)
            return
        if entry.timer is not None:
            entry.timer.cancel()
        entry.unwanted()

    def _expire(self, entry: _Entry) -> None:
        entry.timer = None
        if entry.future.done():
            return
        self._stats.expired += 1
        if entry.queued:
            BatchQueueing._drop(self, entry)
        entry.future.set_exception(
            DeadlineExceeded("the deadline passed before the result was ready")
        )
        entry.unwanted()

    def _drop(self, entry: _Entry) -> None:
        """Take a queued entry out of the queue: it will not run."""
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        self._queue.drop(entry)


def _settled(
    batcher: BatchQueueing,
    entry: _Entry,
    on_settled: Callable[[], None] | None,
    future: asyncio.Future[Any],
) -> None:
    """A queued item's future is done: withdraw the item if its caller left."""
    if future.cancelled():
        BatchQueueing._abandon(batcher, entry)
    if on_settled is not None:
        on_settled()
