"""A streaming stage's worker process: the model and its items' states live here;
each step comes in as a :class:`~microbatch.step_contract.StepJob` and its chunks go back
as a :class:`~microbatch.step_contract.StepDone`.

One step at a time per worker. Both ways a message is a :mod:`.transport` message
(a pickle; large buffers in frames of their own), and the serving side's event loop
writes and reads its ends of the pipes without blocking (:mod:`.pipes`), as it does
a batch worker's. A worker that dies takes its states with it: the step in flight
(or the next one) fails with :class:`~microbatch.errors.WorkerDied`, which ends
every active stream of that worker with that error; the next step starts a fresh
worker.
"""

from __future__ import annotations

import asyncio
import pickle
import signal
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from ..errors import RemoteError, StageFailed, WorkerDied
from ..step_contract import StepDone, StepJob
from ..step_execution import StepExecutor
from .jobs import portable
from .pipes import MessageReader, PipeWriter
from .processes import launch
from .stage import Stage
from .steps import steppable
from .transport import encode, read_message, receive, send, unpicklable
from .worker import WorkerSpec
from .worker_env import WorkerEnv

__all__ = ["ProcessStepRunner", "StepsReady", "step_worker_main"]

_STOP_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class StepsReady:
    """Worker to serving process, once: the model is set up, or failed to."""

    error: RemoteError | None = None


def step_worker_main(
    incoming: Connection, outgoing: Connection, env: WorkerEnv, pickled_spec: bytes
) -> None:
    """Entry point of a streaming worker: StepJob in, StepDone out, until ``None``
    (or the serving process is gone); ``env`` is applied before the model is imported."""
    # The serving process owns shutdown (see worker.py).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        env.apply()
        spec: WorkerSpec = pickle.loads(pickled_spec)
        model = spec.model(*spec.args, **spec.kwargs)
        model.setup(spec.context)
        executor = StepExecutor(steppable(model), spec.isolate_errors)
    except BaseException as exc:
        send(outgoing, StepsReady(RemoteError.from_exception(exc)))
        raise SystemExit(1) from None
    send(outgoing, StepsReady())
    while True:
        try:
            job: StepJob | None = read_message(incoming).decode(None)
        except (EOFError, OSError):  # the serving process is gone
            return
        if job is None:
            return
        done = executor.advance(job)
        done.chunks = portable(done.chunks)
        try:
            send(outgoing, done)
        except OSError:
            return
        except Exception:  # a chunk that does not pickle fails its own item
            bad = unpicklable(done.chunks)
            for index, error in bad.items():
                reason = f"the chunk cannot be sent back: {error}"
                done.chunks[index] = RemoteError("UnpicklableResult", reason, "")
                done.finished[index] = True
                executor.drop(done.keys[index])
            send(outgoing, done)


class ProcessStepRunner:
    """One streaming worker process of a stage (a
    :class:`~microbatch.pipeline.steps.WorkerStepRunner`).

    Its pipes are read and written by the event loop itself, as a batch worker's
    are (:mod:`.pipes`): a step is written to the worker at the call to
    :meth:`advance`, so that the worker computes it while the loop hands out the
    last step's chunks, and its answer is read when the pipe has it, with no thread
    in between. Only spawning and reaping the process, which block, go to a thread.

    Args:
        stage: The stage.
        index: The worker's index.
    """

    def __init__(self, stage: Stage, index: int) -> None:
        self._stage = stage
        self._index = index
        self._io = ThreadPoolExecutor(1, thread_name_prefix=f"microbatch-{stage.name}-io")
        self._worker: _Worker | None = None
        self._answer: asyncio.Future[StepDone] | None = None  # the step in flight
        self._held: set[int] = set()  # keys whose state lives in the worker
        self._restarts = 0

    @property
    def restarts(self) -> int:
        """Times the worker was started again after dying."""
        return self._restarts

    @property
    def pids(self) -> list[int]:
        """The worker's process id, while it lives."""
        worker = self._worker
        return [worker.process.pid] if worker is not None and worker.process.pid else []

    async def start(self) -> None:
        """Spawn the worker and wait until its model is set up.

        Raises:
            StageFailed: It failed to set up ``setup_attempts`` times.
        """
        attempts = self._stage.setup_attempts
        for attempt in range(attempts):
            try:
                await self._spawn()
                return
            except StageFailed:
                if attempt + 1 == attempts:
                    raise

    def advance(self, job: StepJob) -> Awaitable[StepDone]:
        """Send one step to the worker now; its chunks come on what is returned.

        Raises (from awaiting what is returned):
            WorkerDied: The worker died (its states are gone); the next step
                starts a fresh one.
            StageFailed: A fresh worker could not be set up.
        """
        held = self._held - set(job.leave)
        if self._worker is not None and not self._worker.process.is_alive():
            self._lost()  # it died while idle, and the loop has not yet been told
        if self._worker is None:
            if held:  # it died while idle, with states: they are lost
                self._held.clear()
                lost: asyncio.Future[StepDone] = asyncio.get_running_loop().create_future()
                lost.set_exception(WorkerDied(f"stage {self._stage.name!r}: the worker died"))
                return lost
            return self._advance_afresh(job)
        return self._send(job, held)

    async def close(self) -> None:
        """Stop the worker (kill it if it does not exit)."""
        worker = self._worker
        if worker is not None:
            self._unwatch(worker)
            self._fail_answer(WorkerDied(f"stage {self._stage.name!r}: the worker stopped"))
            worker.writer.write(encode(None))  # the worker's cue to exit, after its step
            await asyncio.get_running_loop().run_in_executor(self._io, _reap, worker.process)
            worker.close()
        self._io.shutdown(wait=False)

    # -- on the event loop --------------------------------------------------------

    async def _advance_afresh(self, job: StepJob) -> StepDone:
        """Start a fresh worker (the last one died), then send it ``job``."""
        self._restarts += 1
        await self._spawn()
        return await self._send(job, set())

    def _send(self, job: StepJob, held: set[int]) -> asyncio.Future[StepDone]:
        assert self._worker is not None and self._answer is None, "one step at a time"
        try:
            frames = encode(job)
        except Exception as error:  # an item that does not pickle fails alone
            return self._send_without_unpicklable(job, held, error)
        self._held = held | set(job.join_keys)
        self._answer = answer = asyncio.get_running_loop().create_future()
        self._worker.writer.write(frames)
        return answer

    def _send_without_unpicklable(
        self, job: StepJob, held: set[int], error: Exception
    ) -> asyncio.Future[StepDone]:
        refused = unpicklable(job.join_items)
        if not refused:  # not an item's fault: the step fails as a whole
            self._answer = answer = asyncio.get_running_loop().create_future()
            self._fail_step(error)
            return answer
        kept = [i for i in range(len(job.join_items)) if i not in refused]
        answer = self._send(
            StepJob(
                tuple(job.join_keys[i] for i in kept),
                tuple(job.join_items[i] for i in kept),
                job.leave,
            ),
            held,
        )
        failed = [(job.join_keys[i], error) for i, error in refused.items()]

        def add_refused(done: StepDone) -> StepDone:
            for key, error in failed:
                done.keys.append(key)
                done.chunks.append(error)
                done.finished.append(True)
            return done

        return _then(answer, add_refused)

    def _on_results(self) -> None:
        """The results pipe is readable: settle the step in flight with its answer."""
        worker = self._worker
        assert worker is not None
        try:
            messages = worker.reader.messages()
        except (EOFError, OSError):
            self._lost()
            return
        for message in messages:
            try:
                done: StepDone = message.decode(None)
            except Exception as error:  # say, a chunk of a class this process cannot import
                reason = f"the step's chunks came back but cannot be read: {error}"
                self._fail_step(RemoteError(type(error).__qualname__, reason, ""))
                return
            answer, self._answer = self._answer, None
            ended = (key for key, end in zip(done.keys, done.finished, strict=True) if end)
            self._held.difference_update(ended)
            if answer is not None and not answer.done():
                answer.set_result(done)

    def _on_exit(self) -> None:
        """The worker process ended: take what it answered before, then its loss."""
        if self._worker is not None:
            self._on_results()
        if self._worker is not None:
            self._lost()

    def _lost(self) -> None:
        """The worker is gone: the step in flight fails, the next one spawns afresh."""
        self._drop_worker()
        if self._answer is not None:
            self._held.clear()
            self._fail_answer(WorkerDied(f"stage {self._stage.name!r}: the worker died"))

    def _fail_step(self, error: Exception) -> None:
        """The step in flight fails with ``error`` (its chunks cannot be read here, or
        it could not be sent), and the worker, whose states belong to the streams that
        fail with it, is stopped; the next step spawns afresh."""
        assert self._worker is not None
        self._worker.process.kill()
        self._drop_worker()
        self._held.clear()
        self._fail_answer(error)

    def _drop_worker(self) -> None:
        """Stop watching the worker, close its pipes, reap it on the I/O thread."""
        worker = self._worker
        assert worker is not None
        self._unwatch(worker)
        worker.close()
        self._io.submit(_reap, worker.process)

    def _fail_answer(self, error: Exception) -> None:
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_exception(error)

    async def _spawn(self) -> None:
        process, jobs, results = await asyncio.get_running_loop().run_in_executor(
            self._io, _spawn, self._stage, self._index
        )
        worker = _Worker(
            process, jobs, results, PipeWriter(jobs.fileno()), MessageReader(results.fileno())
        )
        loop = asyncio.get_running_loop()
        loop.add_reader(results.fileno(), self._on_results)
        loop.add_reader(process.sentinel, self._on_exit)
        self._worker = worker

    def _unwatch(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.results.fileno())
        loop.remove_reader(worker.process.sentinel)
        self._worker = None


@dataclass(eq=False)
class _Worker:
    """A live streaming worker: its process and the serving side's pipe ends."""

    process: BaseProcess
    jobs: Connection  # the jobs pipe's write end
    results: Connection  # the results pipe's read end
    writer: PipeWriter
    reader: MessageReader

    def close(self) -> None:
        """Close the serving side's ends (on the event loop: the writer may watch)."""
        self.writer.close()
        self.jobs.close()
        self.results.close()


def _then(
    future: asyncio.Future[StepDone], change: Callable[[StepDone], StepDone]
) -> asyncio.Future[StepDone]:
    """A future of ``change(result)`` once ``future`` has its result (or its error)."""
    out: asyncio.Future[StepDone] = asyncio.get_running_loop().create_future()

    def relay(done: asyncio.Future[StepDone]) -> None:
        if out.cancelled():
            return
        if done.cancelled():
            out.cancel()
        elif (error := done.exception()) is not None:
            out.set_exception(error)
        else:
            out.set_result(change(done.result()))

    future.add_done_callback(relay)
    return out


# -- on the I/O thread (they block) ------------------------------------------------


def _spawn(stage: Stage, index: int) -> tuple[BaseProcess, Connection, Connection]:
    """Start worker ``index`` of ``stage`` and wait until its model is set up: the
    process and the serving side's ends of its jobs and results pipes.

    Raises:
        StageFailed: The model failed to set up (or the worker died meanwhile).
    """
    process, jobs_out, results_in = launch(
        stage, index, step_worker_main, WorkerSpec.of(stage, index)
    )
    try:
        ready = receive(results_in)
    except (EOFError, OSError):
        ready = StepsReady(RemoteError("WorkerDied", "the worker died in setup", ""))
    if ready.error is not None:
        process.join(_STOP_GRACE_S)
        jobs_out.close()
        results_in.close()
        error = ready.error
        raise StageFailed(
            f"stage {stage.name!r}: worker {index} failed in setup:"
            f" {error.type_name}: {error.message}\n{error.traceback_text}"
        )
    return process, jobs_out, results_in


def _reap(process: BaseProcess) -> None:
    """Wait for a worker to exit (it was told to, or died); kill it if it does not."""
    process.join(_STOP_GRACE_S)
    if process.is_alive():
        process.kill()
        process.join()
