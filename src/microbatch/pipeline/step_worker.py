"""A streaming stage's worker process: the model and its items' states live here;
each step comes in as a :class:`~microbatch.step_contract.StepJob` and its chunks go back
as a :class:`~microbatch.step_contract.StepDone`.

One step at a time per worker, so the serving side sends a job and reads its answer
on a thread of its own (the event loop never blocks). A worker that dies takes its
states with it: the step in flight (or the next one) fails with
:class:`~microbatch.errors.WorkerDied`, which ends every active stream of that
worker with that error; the next step starts a fresh worker.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from ..errors import RemoteError, StageFailed, WorkerDied
from ..step_contract import StepDone, StepJob
from ..step_execution import StepExecutor
from .jobs import portable
from .model import WorkerContext
from .stage import Stage
from .steps import steppable
from .transport import unpicklable
from .worker import WorkerSpec
from .worker_env import WorkerEnv

__all__ = ["ProcessStepRunner", "StepsReady", "step_worker_main"]

_SPAWN = multiprocessing.get_context("spawn")
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
        outgoing.send(StepsReady(RemoteError.from_exception(exc)))
        raise SystemExit(1) from None
    outgoing.send(StepsReady())
    while True:
        try:
            job = incoming.recv()
        except (EOFError, OSError):  # the serving process is gone
            return
        if job is None:
            return
        done = executor.advance(job)
        done.chunks = portable(done.chunks)
        try:
            outgoing.send(done)
        except OSError:
            return
        except Exception:  # a chunk that does not pickle fails its own item
            bad = unpicklable(done.chunks)
            for index, error in bad.items():
                reason = f"the chunk cannot be sent back: {error}"
                done.chunks[index] = RemoteError("UnpicklableResult", reason, "")
                done.finished[index] = True
                executor.drop(done.keys[index])
            outgoing.send(done)


class ProcessStepRunner:
    """One streaming worker process of a stage (a
    :class:`~microbatch.pipeline.steps.WorkerStepRunner`).

    Args:
        stage: The stage.
        index: The worker's index.
    """

    def __init__(self, stage: Stage, index: int) -> None:
        self._stage = stage
        self._index = index
        self._io = ThreadPoolExecutor(1, thread_name_prefix=f"microbatch-{stage.name}-io")
        self._process: BaseProcess | None = None
        self._jobs: Connection | None = None
        self._results: Connection | None = None
        self._held: set[int] = set()  # keys whose state lives in the worker
        self._restarts = 0

    @property
    def restarts(self) -> int:
        """Times the worker was started again after dying."""
        return self._restarts

    @property
    def pids(self) -> list[int]:
        """The worker's process id, while it lives."""
        process = self._process
        return [process.pid] if process is not None and process.pid else []

    async def start(self) -> None:
        """Spawn the worker and wait until its model is set up.

        Raises:
            StageFailed: It failed to set up ``setup_attempts`` times.
        """
        attempts = self._stage.setup_attempts
        for attempt in range(attempts):
            try:
                await asyncio.get_running_loop().run_in_executor(self._io, self._spawn)
                return
            except StageFailed:
                if attempt + 1 == attempts:
                    raise

    async def advance(self, job: StepJob) -> StepDone:
        """Send one step to the worker and wait for its chunks.

        Raises:
            WorkerDied: The worker died (its states are gone); the next step
                starts a fresh one.
            StageFailed: A fresh worker could not be set up.
        """
        refused = unpicklable(job.join_items) if job.join_items else {}
        refused_keys = [job.join_keys[i] for i in refused]
        if refused:
            kept = [i for i in range(len(job.join_items)) if i not in refused]
            job = StepJob(
                tuple(job.join_keys[i] for i in kept),
                tuple(job.join_items[i] for i in kept),
                job.leave,
            )
        loop = asyncio.get_running_loop()
        held = self._held - set(job.leave)
        if self._process is not None and not self._process.is_alive():  # died while idle
            await loop.run_in_executor(self._io, self._forget)
            if held:  # states were lost; with none, a fresh worker takes this step
                self._held.clear()
                raise WorkerDied(f"stage {self._stage.name!r}: the worker died")
        if self._process is None:
            self._restarts += 1
            await loop.run_in_executor(self._io, self._spawn)
        self._held = held | set(job.join_keys)
        try:
            done: StepDone = await loop.run_in_executor(self._io, self._exchange, job)
        except WorkerDied:
            self._held.clear()
            raise
        ended = (key for key, end in zip(done.keys, done.finished, strict=True) if end)
        self._held.difference_update(ended)
        for key, error in zip(refused_keys, refused.values(), strict=True):
            done.keys.append(key)  # an item that cannot reach the worker fails alone
            done.chunks.append(error)
            done.finished.append(True)
        return done

    async def close(self) -> None:
        """Stop the worker after its step (kill it if it does not exit)."""
        await asyncio.get_running_loop().run_in_executor(self._io, self._stop)
        self._io.shutdown(wait=False)

    # -- on the I/O thread ----------------------------------------------------------

    def _spawn(self) -> None:
        stage = self._stage
        jobs_in, jobs_out = _SPAWN.Pipe(duplex=False)
        results_in, results_out = _SPAWN.Pipe(duplex=False)
        spec = WorkerSpec(
            stage.model,
            stage.args,
            dict(stage.kwargs),
            WorkerContext(stage.name, self._index),
            stage.config.isolate_errors,
        )
        process = _SPAWN.Process(
            target=step_worker_main,
            args=(
                jobs_in,
                results_out,
                stage.worker_env(self._index),
                pickle.dumps(spec, protocol=5),
            ),
            name=f"microbatch-{stage.name}-{self._index}",
            daemon=True,
        )
        process.start()
        jobs_in.close()
        results_out.close()
        try:
            ready = results_in.recv()
        except (EOFError, OSError):
            ready = StepsReady(RemoteError("WorkerDied", "the worker died in setup", ""))
        if ready.error is not None:
            process.join(_STOP_GRACE_S)
            jobs_out.close()
            results_in.close()
            error = ready.error
            raise StageFailed(
                f"stage {stage.name!r}: worker {self._index} failed in setup:"
                f" {error.type_name}: {error.message}\n{error.traceback_text}"
            )
        self._process, self._jobs, self._results = process, jobs_out, results_in

    def _exchange(self, job: StepJob) -> StepDone:
        assert self._jobs is not None and self._results is not None
        try:
            self._jobs.send(job)
            done: StepDone = self._results.recv()
        except (EOFError, OSError) as error:
            self._forget()
            raise WorkerDied(f"stage {self._stage.name!r}: the worker died") from error
        return done

    def _forget(self) -> None:
        """The worker is dead: reap it and close its pipes."""
        if self._process is not None:
            self._process.join(_STOP_GRACE_S)
        for conn in (self._jobs, self._results):
            if conn is not None:
                conn.close()
        self._process, self._jobs, self._results = None, None, None

    def _stop(self) -> None:
        process = self._process
        if process is None:
            return
        try:
            assert self._jobs is not None
            self._jobs.send(None)
        except OSError:
            pass
        process.join(_STOP_GRACE_S)
        if process.is_alive():
            process.kill()
        self._forget()
