"""A stage's worker processes, driven from the event loop without polling.

Each worker has a pipe each way; the loop reads results as they arrive and writes
batches as the pipe takes them, never blocking (see ``pipes.py``),
and watches the process sentinel for the worker's death. Which worker takes a
batch, the ledger of running batches and the results read back are the pool's
dispatch half (``dispatch.py``, its base class); this module is the workers'
lifecycle: started, set up, warmed up, restarted, stopped.

When a worker dies, the batch it was running is answered :class:`WorkerDied` (or
run once more elsewhere if the stage is idempotent), the batches queued behind it
(never started) go to another worker, and the worker is started again.
"""

from __future__ import annotations

import asyncio
import logging
from multiprocessing.process import BaseProcess
from typing import Any

from ..errors import RemoteError, StageFailed, WorkerDied
from ..execution import settle
from ..types import BatchJob
from .batches import Batch, finished
from .dispatch import BATCHES_PER_WORKER, BatchDispatch
from .failures import died_early, exit_description, setup_failure, user_frames, warm_up_error
from .processes import WorkerHandle, forget, spawn, stop
from .stage import Stage
from .transport import encode
from .worker import Stop

__all__ = ["BATCHES_PER_WORKER", "ProcessPool"]

logger = logging.getLogger("microbatch.workers")

_SETUP_BACKOFF_S = (0.1, 0.5, 2.0)  # between setup attempts of one start
_MAX_RESTART_BACKOFF_S = 60.0  # between starts of a worker whose setups keep failing


class ProcessPool(BatchDispatch):
    """The worker processes of one stage: a :class:`~microbatch.types.BatchRunner`.

    Args:
        stage: The stage to run.
    """

    def __init__(self, stage: Stage) -> None:
        super().__init__(stage)
        self._restarts = 0
        self._restart_tasks: set[asyncio.Task[None]] = set()
        self._reaping: dict[BaseProcess, asyncio.Future[None]] = {}  # exiting workers
        self._serving_workers = 0  # alive and serving: counted as they change, not per ask

    @property
    def restarts(self) -> int:
        """Workers started again after dying."""
        return self._restarts

    @property
    def alive(self) -> int:
        """Workers set up, warmed up and able to take a batch now."""
        return self._serving_workers  # asked for every request a service admits

    @property
    def failure(self) -> StageFailed | None:
        """Why the stage fails every batch now: its workers kept dying in setup, or
        it is closed (None while it serves or a worker is starting again)."""
        return self._failed

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.process.pid for w in self._workers if w is not None and w.process.pid]

    def running_since(self) -> float | None:
        """When the oldest batch running now started (``time.monotonic()``), or None.
        A batch waiting at a worker behind the one it runs is not running yet."""
        since = [w.busy_since for w in self._workers if w is not None and w.busy_since is not None]
        return min(since) if since else None

    async def start(self) -> None:
        """Start every worker and wait until each has set up its model.

        The workers take batches once :meth:`warm_up` has run through them.

        Raises:
            StageFailed: A worker kept dying during setup.
        """
        attempts = self.stage.setup_attempts
        # Every start runs to its end before a failure is raised, so that no worker
        # is still being spawned while the caller closes the pool.
        outcomes = await asyncio.gather(
            *(self._start_worker(index, attempts) for index in range(self.stage.workers)),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, StageFailed):
                self._fail(outcome)
            if isinstance(outcome, BaseException):
                raise outcome

    async def warm_up(self, items: list[Any]) -> list[Any]:
        """Run ``items`` as one batch through every worker, then let them take batches.

        Workers started later (after a crash) run the same items before they take
        a batch. Returns the outcomes of the first worker: the next stage's items.

        Raises:
            StageFailed: An item failed or a worker died while warming up.
        """
        self._warm_up_items = list(items)
        workers = [w for w in self._workers if w is not None and w.alive]
        outcomes = await asyncio.gather(*(self._warm(w) for w in workers), return_exceptions=True)
        results: list[list[Any]] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                failure = StageFailed(f"stage {self.stage.name!r}: warm-up failed: {outcome}")
                self._fail(failure)
                raise failure from outcome
            results.append(outcome)
        for worker in workers:
            if worker.alive:
                self._serve(worker)
            elif not self._closing:  # died after its warm-up, before it served
                self._restart_later(worker.index)
        return results[0] if results else []

    async def close(self) -> None:
        """Stop the workers: each finishes the batches it holds, then exits; one that
        does not within a grace period is killed. Every batch is answered."""
        self._closing = True
        closed = StageFailed(f"stage {self.stage.name!r} is closed")
        self._fail(closed)
        for task in list(self._restart_tasks):
            task.cancel()
        loop = asyncio.get_running_loop()
        live = [w for w in self._workers if w is not None and w.alive]
        for worker in live:
            loop.remove_reader(worker.process.sentinel)  # stop() reaps it now
            worker.writer.write(encode(Stop()))
        await asyncio.gather(*(loop.run_in_executor(None, stop, w.process) for w in live))
        for worker in live:
            self._drain(worker)  # results written just before it exited
            self._lost(worker)
            cut = StageFailed(f"stage {self.stage.name!r} closed before the batch finished")
            for batch in worker.batches.values():
                settle(batch.future, cut)
            worker.batches.clear()
            forget(worker)
        self._fail(closed)  # whatever came back to the backlog meanwhile
        await asyncio.gather(*self._reaping.values())
        await asyncio.gather(*self._copies, return_exceptions=True)  # results already out

    def _on_death(self, worker: WorkerHandle) -> None:
        if not worker.alive:
            return
        self._lost(worker)
        self._drain(worker)  # results it sent before it died count
        forget(worker)
        worker.process.join(0)  # reap it now if it has exited (no zombie)
        if worker.process.exitcode is None:  # its pipes closed a moment before it exited
            self._reap(worker.process)
        code = worker.process.exitcode
        if not worker.set_up.done():
            worker.set_up.set_exception(WorkerDied(died_early(code)))
        held = list(worker.batches.values())
        worker.batches.clear()
        died = WorkerDied(
            f"stage {self.stage.name!r}: worker {worker.index} died (exit code {code})"
        )
        if worker.serving and not self._closing:  # else: a setup failure, or closing
            self._log_death(worker, len(held))
        # Batches queued behind the running one never started: another worker may
        # run them, unless the pool is closing (then nothing would ever take them).
        again = worker.serving and not self._closing
        if held:
            running, queued = held[0], held[1:]  # a worker runs its batches in order
            if running.end > worker.writer.taken and again:
                queued.insert(0, running)  # it never reached the worker's pipe
            elif running.retry and again:
                running.retry = False
                queued.insert(0, running)
            else:
                settle(running.future, died)
            for batch in queued:
                batch.worker = None
                if not again:
                    settle(batch.future, died)
            if again:
                self._backlog.extendleft(reversed(queued))
        if again:
            self._restart_later(worker.index)
        self._pump()

    def _restart_later(self, index: int) -> None:
        """Start worker ``index`` again, in a task of its own."""
        task = asyncio.get_running_loop().create_task(self._restart(index))
        self._restart_tasks.add(task)
        task.add_done_callback(self._restart_tasks.discard)

    async def _start_worker(self, index: int, attempts: int) -> None:
        errors: list[Exception] = []
        for attempt in range(attempts):
            worker = spawn(self.stage, index, BATCHES_PER_WORKER, self._on_message, self._on_death)
            self._workers[index] = worker
            try:
                await worker.set_up
                if self._warm_up_items is not None:  # a restart: warm up, then serve
                    await self._warm(worker)
                    if not worker.alive:  # died after its warm-up's answer came
                        code = worker.process.exitcode
                        raise WorkerDied(f"died as it warmed up (exit code {code})")
                    self._serve(worker)
                return
            except RemoteError as exc:
                errors.append(exc)
                self._stop_quietly(worker)
                _log_setup_failure(self.stage.name, index, attempt + 1, attempts, exc)
            except WorkerDied as exc:
                errors.append(exc)
                _log_setup_failure(self.stage.name, index, attempt + 1, attempts, exc)
            if attempt + 1 < attempts:
                await asyncio.sleep(_SETUP_BACKOFF_S[min(attempt, len(_SETUP_BACKOFF_S) - 1)])
        raise setup_failure(f"stage {self.stage.name!r}: worker {index}", attempts, errors)

    async def _warm(self, worker: WorkerHandle) -> list[Any]:
        """Run the warm-up items on ``worker``; an item's error fails the warm-up."""
        items = self._warm_up_items or []
        if not items:
            return []
        if not worker.alive:
            raise WorkerDied(f"stage {self.stage.name!r}: worker {worker.index} died")
        job = BatchJob(items, [None] * len(items), _always, len(items))
        batch = Batch(job, asyncio.get_running_loop().create_future(), retry=False)
        self._send(worker, batch)
        outcomes = finished(batch, await batch.future, self._rows).outcomes
        error = warm_up_error(items, outcomes)
        if error is not None:
            raise error
        return outcomes

    def _serve(self, worker: WorkerHandle) -> None:
        if worker.alive and not worker.serving and not self._closing:
            worker.serving = True
            self._serving_workers += 1
            self._pump()

    def _lost(self, worker: WorkerHandle) -> None:
        """``worker`` takes no more batches: it died, or it is stopped (once; its
        death may be seen while the pool closes it)."""
        if worker.alive and worker.serving:
            self._serving_workers -= 1
        worker.alive = False

    def _stop_quietly(self, worker: WorkerHandle) -> None:
        """Stop a worker that failed to set up or warm up (no restart, no WorkerDied)."""
        if worker.alive:
            self._lost(worker)
            forget(worker)
            worker.process.kill()
            self._reap(worker.process)

    def _log_death(self, worker: WorkerHandle, held: int) -> None:
        """A warning naming the exit code or signal (once the process is reaped)."""
        process = worker.process

        def log(_: object = None) -> None:
            logger.warning(
                "stage %r: worker %d (pid %s) died, %s, holding %d batch(es); starting it again",
                self.stage.name,
                worker.index,
                process.pid,
                exit_description(process.exitcode),
                held,
            )

        reaping = self._reaping.get(process)
        if reaping is None:
            log()
        else:
            reaping.add_done_callback(log)

    def _reap(self, process: BaseProcess) -> None:
        """Wait for an exiting worker in a thread, then let it go: a worker kept
        until close would keep a zombie and its sentinel's descriptor for as long as
        the service runs (one more with every crash)."""
        future = asyncio.get_running_loop().run_in_executor(None, stop, process)
        self._reaping[process] = future
        future.add_done_callback(lambda _: self._reaping.pop(process, None))

    def _fail(self, failure: StageFailed) -> None:
        """From now on every run fails fast with ``failure``; so do the waiting ones."""
        if self._failed is None:
            self._failed = failure
        while self._backlog:
            settle(self._backlog.popleft().future, failure)

    async def _restart(self, index: int) -> None:
        """Start worker ``index`` again; while its setup keeps failing, try again
        with a growing pause, and while no worker serves, fail runs fast."""
        self._restarts += 1
        pause = _SETUP_BACKOFF_S[-1]
        while True:
            try:
                await self._start_worker(index, attempts=self.stage.setup_attempts)
            except StageFailed as failure:
                if not self.alive:
                    self._fail(failure)
                logger.warning(
                    "stage %r: worker %d could not be started again; next try in %.1f s",
                    self.stage.name,
                    index,
                    pause,
                )
                await asyncio.sleep(pause)
                pause = min(2 * pause, _MAX_RESTART_BACKOFF_S)
            else:
                if not self._closing:
                    self._failed = None  # serving again
                    logger.warning(
                        "stage %r: worker %d started again (restart %d of this stage)",
                        self.stage.name,
                        index,
                        self._restarts,
                    )
                return


def _always(index: int) -> bool:
    return True


def _log_setup_failure(
    stage: str, index: int, attempt: int, attempts: int, error: Exception
) -> None:
    """A warning with the traceback into the user's code (our frames left out)."""
    text = error.traceback_text if isinstance(error, RemoteError) else ""
    logger.warning(
        "stage %r: worker %d failed to set up (attempt %d of %d): %s%s",
        stage,
        index,
        attempt,
        attempts,
        error,
        "\n" + user_frames(text) if text else "",
    )
