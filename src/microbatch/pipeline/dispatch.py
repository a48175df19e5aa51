"""Batches to a stage's worker processes, and their results back: the dispatch half
of :class:`~.pool.ProcessPool` (its base class; the pool adds the workers' lifecycle).

A batch goes to the least busy worker — an idle one first; a worker may also hold
the next batch in its pipe while it runs one, so that it starts the next the moment
it finishes, without waiting for the serving process.

The pool is the one owner of the ledger of running batches: the worker stamps when
the model really started and finished each batch, and the times come back with the
result (in the message header, read before the result is decoded). A batch sent to
an idle worker starts when sent; one held behind a running batch starts when the
worker was done with that one.

Items whose caller left, or whose deadline passed, are never computed: they are left
out when the batch is sent, by the worker when it comes to the batch (deadlines), and
by a :class:`~.worker.Drop` the pool sends when a caller leaves while its batch waits
at the worker behind the running one. Their outcomes are made here.

Each batch a worker holds has a slot of its own in the worker's shared-memory arena
(see ``arena.py``), from when it is sent until its result has been copied out. A
large result is copied out on a thread, so the event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from ..errors import StageFailed, WorkerDied
from ..execution import settle
from ..types import BatchDone, BatchJob
from .batches import Batch, decoded, finished, prepare, unwanted
from .jobs import Ran
from .processes import WorkerHandle
from .stage import Stage
from .transport import Incoming
from .worker import SetUp

__all__ = ["BATCHES_PER_WORKER", "BatchDispatch"]

_COPY_ON_THREAD_BYTES = 4 << 20  # results with more in shared memory are copied out on a thread

BATCHES_PER_WORKER = 2
"""Batches a worker holds: the one it runs and the next, waiting in its pipe so that
the worker starts it the moment the first is done (the batcher's run-ahead)."""


class BatchDispatch:
    """Batches queued, sent to the least busy worker and answered from its results:
    the base of :class:`~.pool.ProcessPool`, which starts, restarts and stops the
    workers (``_workers``) and handles their deaths (:meth:`_on_death`).

    Args:
        stage: The stage to run.
    """

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self._rows = stage.config.row_format()
        self._workers: list[WorkerHandle | None] = [None] * stage.workers
        self._backlog: deque[Batch] = deque()  # batches waiting for a worker
        self._copies: set[asyncio.Future[Any]] = set()  # large results copied out on threads
        self._closing = False
        self._failed: StageFailed | None = None
        self._warm_up_items: list[Any] | None = None  # known once warm_up() ran
        # Batches handed over with begin(), not reported yet: how to report each.
        self._reports: dict[Batch, Callable[[object], None]] = {}

    async def run(self, job: BatchJob) -> BatchDone:
        """Run one batch on the least busy worker; return its outcomes and when the
        model really started and finished it.

        Items whose caller left or whose deadline passed before the model came to
        them are left out (DeadlineExceeded for an expired one). Never raises for the
        batch as a whole: a model error is at its item's place (a RemoteError, or the
        ItemError the model gave), and a dead worker or failed stage is every item's
        outcome, so the batcher does not split and run again what may not be run twice.
        """
        batch = self._queue_job(job)
        if isinstance(batch, BatchDone):
            return batch
        try:
            await batch.future
        except (WorkerDied, StageFailed):
            pass
        finally:
            job.on_unwanted = None
        return self._outcome(batch)

    def begin(self, job: BatchJob, on_done: Callable[[BatchDone], None]) -> None:
        """:meth:`run` without a task: send the batch now (when a worker has room)
        and call ``on_done`` with what :meth:`run` would return, once, from the event
        loop and never from within this call.

        A result read from a worker is reported in the same loop round it is read
        (the batcher then settles its callers' futures at once): a batch handed over
        this way takes no task and no loop round each way.
        """
        batch = self._queue_job(job)
        loop = asyncio.get_running_loop()
        if isinstance(batch, BatchDone):
            loop.call_soon(on_done, batch)
            return
        report = partial(self._report, batch, on_done)
        self._reports[batch] = report
        batch.future.add_done_callback(report)  # any other way the batch ends

    def _queue_job(self, job: BatchJob) -> Batch | BatchDone:
        """Queue ``job`` for a worker (and send it if one has room), or what it
        comes to at once when no worker would take it."""
        count = len(job.items)
        if self._failed is not None:
            # A fresh error each time: raising one instance in every caller would
            # grow its traceback (and keep their frames) for as long as the outage lasts.
            return BatchDone([StageFailed(str(self._failed))] * count)
        if self._warm_up_items is None:  # no worker would ever take it
            failure = StageFailed(f"stage {self.stage.name!r}: run() before warm_up()")
            return BatchDone([failure] * count)
        batch = Batch(job, asyncio.get_running_loop().create_future(), self.stage.idempotent)
        self._backlog.append(batch)
        self._pump()
        return batch

    def _outcome(self, batch: Batch) -> BatchDone:
        """What a done batch comes to: its outcomes, or every item's WorkerDied or
        StageFailed."""
        future = batch.future
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            if not isinstance(error, (WorkerDied, StageFailed)):
                error = StageFailed(f"stage {self.stage.name!r}: the batch was lost: {error!r}")
            return BatchDone([error] * len(batch.job.items))
        return finished(batch, future.result(), self._rows)

    def _report(self, batch: Batch, on_done: Callable[[BatchDone], None], _: object = None) -> None:
        """Tell a started batch's caller how it went (once)."""
        if self._reports.pop(batch, None) is None:
            return  # reported already
        batch.job.on_unwanted = None
        on_done(self._outcome(batch))

    def _ran(self, batch: Batch, ran: Ran) -> None:
        """A worker's result for ``batch``: settle it, and report it now if it was
        handed over with :meth:`begin` (rather than one loop round later)."""
        report = self._reports.get(batch)
        if report is None:
            settle(batch.future, ran)
            return
        batch.future.remove_done_callback(report)
        settle(batch.future, ran)
        try:
            report(None)
        except Exception as exc:  # the reader must go on reading
            asyncio.get_running_loop().call_exception_handler(
                {"message": "reporting a finished batch failed", "exception": exc}
            )

    def _pump(self) -> None:
        """Send waiting batches to workers with room, the least busy first."""
        while self._backlog:
            worker = self._least_busy()
            if worker is None:
                return
            batch = self._backlog.popleft()
            if not batch.future.done():  # else its caller left
                self._send(worker, batch)

    def _least_busy(self) -> WorkerHandle | None:
        best: WorkerHandle | None = None
        for worker in self._workers:
            if worker is None or not (worker.alive and worker.serving):
                continue
            if worker.held < BATCHES_PER_WORKER and (best is None or worker.held < best.held):
                best = worker
        return best

    def _send(self, worker: WorkerHandle, batch: Batch) -> None:
        """Send ``batch`` to ``worker``, less the items no longer wanted and those that
        cannot be pickled (answered here); never raises."""
        slot = worker.free_slot()
        frames = prepare(batch, slot, None if worker.arena is None else worker.arena.outgoing(slot))
        if frames is None:  # nothing to run: answered here, without the worker
            settle(batch.future, Ran([], None, None, 0))
            return
        worker.took(slot, batch)
        batch.job.on_unwanted = partial(unwanted, batch)
        batch.end = worker.writer.write(frames)

    def _on_message(self, worker: WorkerHandle) -> None:
        try:
            messages = worker.reader.messages()
        except (EOFError, OSError):
            self._on_death(worker)
            return
        for message in messages:
            self._handle(worker, message)

    def _drain(self, worker: WorkerHandle) -> None:
        """Handle the results a worker wrote before it exited."""
        while worker.batches and not worker.conn.closed:
            try:
                messages = worker.reader.messages()
            except (EOFError, OSError):
                return
            if not messages:
                return
            for message in messages:
                self._handle(worker, message)

    def _handle(self, worker: WorkerHandle, message: Incoming) -> None:
        if message.slot is None:  # the worker is set up, or failed to
            if worker.arena is not None:
                worker.arena.unlink()  # the worker has opened its files by now
            set_up = message.decode(None)
            if isinstance(set_up, SetUp) and not worker.set_up.done():  # cancelled: closed
                settle(worker.set_up, set_up.error)
            return
        batch = worker.answered(message.slot, message.times[1])
        if batch is not None:
            if message.arena_bytes > _COPY_ON_THREAD_BYTES:
                self._copy_on_thread(worker, message, batch)
            else:
                source = None if worker.arena is None else worker.arena.incoming(message.slot)
                self._ran(batch, decoded(batch, message.times, lambda: message.decode(source)))
        if worker.serving and not self._closing:
            self._pump()

    def _copy_on_thread(self, worker: WorkerHandle, message: Incoming, batch: Batch) -> None:
        """Copy a large result out of shared memory and unpickle it on a thread; its
        batch keeps its slot until then, so the worker cannot overwrite it."""
        assert worker.arena is not None and message.slot is not None
        slot = message.slot
        worker.receiving[slot] = batch
        reader = worker.arena.incoming(slot).reader()  # outlives the arena if the worker dies

        def decode() -> Any:
            with reader:
                return message.decode(reader)

        copy = asyncio.get_running_loop().run_in_executor(None, decode)
        self._copies.add(copy)

        def done(copy: asyncio.Future[Any]) -> None:
            self._copies.discard(copy)
            del worker.receiving[slot]
            if copy.cancelled():
                settle(batch.future, StageFailed(f"stage {self.stage.name!r} is closed"))
            else:
                settle(batch.future, decoded(batch, message.times, copy.result))
            if worker.serving and not self._closing:
                self._pump()

        copy.add_done_callback(done)

    def _on_death(self, worker: WorkerHandle) -> None:
        """``worker``'s pipe closed: it died (handled by the pool's lifecycle)."""
        raise NotImplementedError
