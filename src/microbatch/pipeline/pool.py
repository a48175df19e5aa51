"""A stage's worker processes, driven from the event loop without polling.

Each worker has a duplex pipe; the loop watches the pipe (``add_reader``) for
results and the process sentinel for its death. A batch goes to an idle worker;
when a worker dies, the batch it held is answered :class:`WorkerDied` (or run once
more elsewhere if the stage is idempotent) and the worker is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ..errors import RemoteError, StageFailed, WorkerDied
from .model import WorkerContext
from .stage import Stage
from .transport import receive, send
from .worker import READY, SETUP_FAILED, WorkerSpec, worker_main

__all__ = ["ProcessPool"]

_SPAWN = multiprocessing.get_context("spawn")
_STOP_GRACE_S = 5.0
_SETUP_BACKOFF_S = (0.1, 0.5, 2.0)  # between setup attempts of one start
_MAX_RESTART_BACKOFF_S = 60.0  # between starts of a worker whose setups keep failing


@dataclass(eq=False)
class _Worker:
    index: int
    process: BaseProcess
    conn: Connection
    set_up: asyncio.Future[None]  # the model is built and set up in the process
    batch: tuple[int, list[Any], asyncio.Future[list[Any]], bool] | None = None
    alive: bool = True
    serving: bool = False  # warmed up and handed to the idle queue at least once


class ProcessPool:
    """The worker processes of one stage.

    Args:
        stage: The stage to run.
    """

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self._workers: list[_Worker | None] = [None] * stage.workers
        self._idle: asyncio.Queue[_Worker | None] = asyncio.Queue()  # None: stage failed
        self._batch_ids = itertools.count()
        self._restarts = 0
        self._closing = False
        self._failed: StageFailed | None = None
        self._restart_tasks: set[asyncio.Task[None]] = set()
        self._dead: list[BaseProcess] = []  # exited workers, reaped at close if not before
        self._warm_up_items: list[Any] | None = None  # known once warm_up() ran

    @property
    def restarts(self) -> int:
        """Workers started again after dying."""
        return self._restarts

    @property
    def alive(self) -> int:
        """Workers set up and able to take a batch now."""
        return sum(1 for w in self._workers if w is not None and w.alive and w.serving)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.process.pid for w in self._workers if w is not None and w.process.pid]

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
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                failure = StageFailed(f"stage {self.stage.name!r}: warm-up failed: {outcome}")
                self._fail(failure)
                raise failure from outcome
        for worker in workers:
            self._serve(worker)
        first = outcomes[0] if outcomes else []
        assert isinstance(first, list)
        return first

    async def run(self, items: list[Any]) -> list[Any]:
        """Run one batch on an idle worker; return its outcomes.

        Never raises for the batch as a whole: a model error is a RemoteError at its
        item's place, and a dead worker or failed stage is every item's outcome, so
        the batcher does not split and run again what may not be run twice.
        """
        try:
            worker = await self._idle_worker()
            return await self._send(worker, items, retry=self.stage.idempotent)
        except (WorkerDied, StageFailed) as exc:
            return [exc] * len(items)

    async def _idle_worker(self) -> _Worker:
        while True:
            if self._failed is not None:
                raise self._failed
            worker = await self._idle.get()
            if worker is None:  # the stage failed or closed: tell the next waiter too
                if self._failed is not None:
                    self._idle.put_nowait(None)
            elif worker.alive:
                return worker

    async def close(self) -> None:
        """Stop the workers: each finishes the batch it holds, then exits; one that
        does not within a grace period is terminated, then killed."""
        self._closing = True
        self._fail(StageFailed(f"stage {self.stage.name!r} is closed"))
        for task in list(self._restart_tasks):
            task.cancel()
        loop = asyncio.get_running_loop()
        live = [w for w in self._workers if w is not None and w.alive]
        for worker in live:
            loop.remove_reader(worker.process.sentinel)  # _stop reaps it now
            with contextlib.suppress(OSError):  # already gone: nothing to ask
                send(worker.conn, None)
        await asyncio.gather(*(loop.run_in_executor(None, _stop, w.process) for w in live))
        for worker in live:
            while worker.alive and worker.batch is not None and _has_data(worker.conn):
                self._on_message(worker)  # a result written just before it exited
            worker.alive = False
            if worker.batch is not None:
                _, _, future, _ = worker.batch
                worker.batch = None
                if not future.done():
                    future.set_exception(
                        StageFailed(f"stage {self.stage.name!r} closed before the batch finished")
                    )
            self._forget(worker)
        for process in self._dead:
            await loop.run_in_executor(None, _stop, process)
        self._dead.clear()

    # -- workers -------------------------------------------------------------------

    async def _start_worker(self, index: int, attempts: int) -> None:
        errors: list[RemoteError] = []
        for attempt in range(attempts):
            worker = self._spawn(index)
            try:
                await worker.set_up
                if self._warm_up_items is not None:  # a restart: warm up, then serve
                    await self._warm(worker)
                    self._serve(worker)
                return
            except RemoteError as exc:
                errors.append(exc)
                self._stop_quietly(worker)
            except WorkerDied:
                pass
            if attempt + 1 < attempts:
                await asyncio.sleep(_SETUP_BACKOFF_S[min(attempt, len(_SETUP_BACKOFF_S) - 1)])
        cause = f": {errors[-1]}" if errors else ""
        failure = StageFailed(
            f"stage {self.stage.name!r}: worker {index} died {attempts} times in setup{cause}"
        )
        raise failure

    async def _warm(self, worker: _Worker) -> list[Any]:
        """Run the warm-up items on ``worker``; an item's error fails the warm-up."""
        items = self._warm_up_items or []
        if not items:
            return []
        outcomes = await self._send(worker, items, retry=False)
        for item, outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if isinstance(outcome, RemoteError):
                    raise RemoteError(
                        outcome.type_name,
                        f"warm-up item {item!r:.80} failed: {outcome.message}",
                        outcome.traceback_text,
                    )
                raise outcome
        return outcomes

    def _serve(self, worker: _Worker) -> None:
        if worker.alive and not worker.serving and not self._closing:
            worker.serving = True
            self._idle.put_nowait(worker)

    def _stop_quietly(self, worker: _Worker) -> None:
        """Stop a worker that failed to set up or warm up (no restart, no WorkerDied)."""
        if worker.alive:
            worker.alive = False
            self._forget(worker)
            worker.process.kill()
            self._dead.append(worker.process)

    def _fail(self, failure: StageFailed) -> None:
        """From now on every run fails fast with ``failure``, waiting ones included."""
        if self._failed is None:
            self._failed = failure
            self._idle.put_nowait(None)

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
                await asyncio.sleep(pause)
                pause = min(2 * pause, _MAX_RESTART_BACKOFF_S)
            else:
                if not self._closing:
                    self._failed = None  # serving again; its None marker is skipped
                return

    def _spawn(self, index: int) -> _Worker:
        loop = asyncio.get_running_loop()
        parent, child = _SPAWN.Pipe(duplex=True)
        spec = WorkerSpec(
            self.stage.model,
            self.stage.args,
            dict(self.stage.kwargs),
            WorkerContext(self.stage.name, index),
            self.stage.config.isolate_errors,
            self.stage.env_for(index),
            self.stage.cpus_for(index),
        )
        process = _SPAWN.Process(
            target=worker_main,
            args=(child, pickle.dumps(spec, protocol=5)),
            name=f"microbatch-{self.stage.name}-{index}",
            daemon=True,
        )
        process.start()
        child.close()
        worker = _Worker(index, process, parent, loop.create_future())
        self._workers[index] = worker
        loop.add_reader(parent.fileno(), self._on_message, worker)
        loop.add_reader(process.sentinel, self._on_death, worker)
        return worker

    def _on_message(self, worker: _Worker) -> None:
        try:
            kind, payload = receive(worker.conn)
        except (EOFError, OSError):
            self._on_death(worker)
            return
        if kind == READY:
            worker.set_up.set_result(None)
        elif kind == SETUP_FAILED:
            worker.set_up.set_exception(payload)
        elif worker.batch is not None and worker.batch[0] == kind:
            _, _, future, _ = worker.batch
            worker.batch = None
            if not future.done():
                future.set_result(payload)
            if worker.serving and worker.alive and not self._closing:
                self._idle.put_nowait(worker)

    def _on_death(self, worker: _Worker) -> None:
        if not worker.alive:
            return
        worker.alive = False
        self._forget(worker)
        worker.process.join(0)  # reap it now if it has exited (no zombie)
        if worker.process.exitcode is None:
            self._dead.append(worker.process)  # not quite gone yet: reaped at close
        code = worker.process.exitcode
        if not worker.set_up.done():
            worker.set_up.set_exception(WorkerDied(f"worker died in setup (exit code {code})"))
        if worker.batch is not None:
            _, items, future, retry = worker.batch
            worker.batch = None
            if retry and not self._closing:
                task = asyncio.get_running_loop().create_task(self._retry(items, future))
                self._restart_tasks.add(task)
                task.add_done_callback(self._restart_tasks.discard)
            elif not future.done():
                future.set_exception(
                    WorkerDied(
                        f"stage {self.stage.name!r}: worker {worker.index} died (exit code {code})"
                    )
                )
        if worker.serving and not self._closing:
            task = asyncio.get_running_loop().create_task(self._restart(worker.index))
            self._restart_tasks.add(task)
            task.add_done_callback(self._restart_tasks.discard)

    async def _retry(self, items: list[Any], future: asyncio.Future[list[Any]]) -> None:
        try:
            worker = await self._idle_worker()
            outcome = await self._send(worker, items, retry=False)
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(outcome)

    async def _send(self, worker: _Worker, items: list[Any], retry: bool) -> list[Any]:
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        batch_id = next(self._batch_ids)
        try:
            send(worker.conn, (batch_id, items))
        except OSError:  # it died before the batch reached it: another worker may run it
            self._on_death(worker)
            if not worker.serving:  # warming up: this worker's start failed
                raise WorkerDied(f"stage {self.stage.name!r}: worker {worker.index} died") from None
            return await self._send(await self._idle_worker(), items, retry)
        worker.batch = (batch_id, items, future, retry)
        return await future

    def _forget(self, worker: _Worker) -> None:
        """Stop watching a worker's pipe and sentinel, and close its pipe."""
        if worker.conn.closed:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.conn.fileno())
        loop.remove_reader(worker.process.sentinel)
        worker.conn.close()


def _stop(process: BaseProcess) -> None:
    """Wait for a worker to exit; terminate, then kill, if it does not."""
    process.join(_STOP_GRACE_S)
    if process.is_alive():
        process.terminate()
        process.join(_STOP_GRACE_S)
    if process.is_alive():
        process.kill()
        process.join()


def _has_data(conn: Connection) -> bool:
    try:
        return conn.poll(0)
    except (OSError, EOFError):
        return False
