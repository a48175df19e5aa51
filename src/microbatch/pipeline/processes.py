"""Starting and stopping one worker process, and the serving side's handle on it."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from .arena import Arena
from .pipes import MessageReader, PipeWriter
from .stage import Stage
from .worker import WorkerSpec, worker_main
from .worker_env import WorkerEnv

if TYPE_CHECKING:
    from .batches import Batch

__all__ = ["WorkerHandle", "forget", "launch", "spawn", "stop"]

_SPAWN = multiprocessing.get_context("spawn")
_STOP_GRACE_S = 5.0


@dataclass(eq=False)
class WorkerHandle:
    """The serving process's view of one worker process: its pipes, the batches it
    holds, and since when it runs the oldest of them (the pool's ledger)."""

    index: int
    process: BaseProcess
    conn: Connection  # the results pipe's read end
    reader: MessageReader  # the results come in here
    out: Connection  # the batches pipe's write end
    writer: PipeWriter  # the batches go out here
    set_up: asyncio.Future[None]  # resolved when the model is built and set up
    arena: Arena | None = None  # its shared memory (None: everything goes by pipe)
    batches: dict[int, Batch] = field(default_factory=dict)  # sent, by slot, oldest first
    receiving: dict[int, Batch] = field(default_factory=dict)  # answered, being copied out
    alive: bool = True
    serving: bool = False  # warmed up: takes batches
    busy_since: float | None = None  # when it started the oldest batch it holds

    @property
    def held(self) -> int:
        """Batches holding one of its slots: sent, or answered but not yet copied out."""
        return len(self.batches) + len(self.receiving)

    def free_slot(self) -> int:
        """The lowest slot no batch holds."""
        slot = 0
        while slot in self.batches or slot in self.receiving:
            slot += 1
        return slot

    def took(self, slot: int, batch: Batch) -> None:
        """``batch`` was sent for ``slot``: an idle worker starts it now."""
        if not self.batches:
            self.busy_since = time.monotonic()
        self.batches[slot] = batch
        batch.worker, batch.slot = self, slot

    def answered(self, slot: int, done_s: float) -> Batch | None:
        """The worker was done with the batch in ``slot`` at ``done_s`` (its clock,
        which is this one); the next batch it holds started then."""
        batch = self.batches.pop(slot, None)
        if not self.batches:
            self.busy_since = None
        else:
            self.busy_since = time.monotonic() if math.isnan(done_s) else done_s
        return batch


def spawn(
    stage: Stage,
    index: int,
    slots: int,
    on_message: Callable[[WorkerHandle], None],
    on_death: Callable[[WorkerHandle], None],
) -> WorkerHandle:
    """Start worker ``index`` of ``stage``, with an arena of ``slots`` batch slots;
    the running loop watches its pipe and sentinel."""
    loop = asyncio.get_running_loop()
    arena = Arena.create(slots)
    spec = WorkerSpec.of(
        stage,
        index,
        arena=() if arena is None else arena.names,
        rows=stage.config.row_format(),
        oom_errors=stage.config.oom_errors if stage.config.split_on_oom else None,
    )
    try:
        process, batches_out, results_in = launch(stage, index, worker_main, spec)
    except BaseException:
        if arena is not None:
            arena.close()
        raise
    worker = WorkerHandle(
        index,
        process,
        results_in,
        MessageReader(results_in.fileno()),
        batches_out,
        PipeWriter(batches_out.fileno()),
        loop.create_future(),
        arena,
    )
    loop.add_reader(results_in.fileno(), on_message, worker)
    loop.add_reader(process.sentinel, on_death, worker)
    return worker


def launch(
    stage: Stage,
    index: int,
    main: Callable[[Connection, Connection, WorkerEnv, bytes], None],
    spec: WorkerSpec,
) -> tuple[BaseProcess, Connection, Connection]:
    """Start worker ``index`` of ``stage``: a spawned process running ``main`` with
    its two one-way pipes (in, out), its variables and ``spec`` (pickled, so that a
    model it cannot import is its own error); the process, and this side's ends: what
    goes to it, what comes back. Each end's blocking mode is its own (the worker's
    ends block)."""
    jobs_in, jobs_out = _SPAWN.Pipe(duplex=False)
    results_in, results_out = _SPAWN.Pipe(duplex=False)
    process = _SPAWN.Process(
        target=main,
        args=(jobs_in, results_out, stage.worker_env(index), pickle.dumps(spec, protocol=5)),
        name=f"microbatch-{stage.name}-{index}",
        daemon=True,
    )
    try:
        process.start()
    except BaseException:
        results_in.close()
        jobs_out.close()
        raise
    finally:
        jobs_in.close()
        results_out.close()
    return process, jobs_out, results_in


def forget(worker: WorkerHandle) -> None:
    """Stop watching a worker's pipes and sentinel, close them and its arena."""
    if worker.conn.closed:
        return
    loop = asyncio.get_running_loop()
    loop.remove_reader(worker.conn.fileno())
    loop.remove_reader(worker.process.sentinel)
    worker.writer.close()
    worker.conn.close()
    worker.out.close()
    worker.busy_since = None
    if worker.arena is not None:
        worker.arena.close()


def stop(process: BaseProcess) -> None:
    """Wait for a worker to exit; kill it if it does not (blocking). Workers ignore
    SIGTERM (a group-wide stop must not cut a batch), so there is no terminate step."""
    process.join(_STOP_GRACE_S)
    if process.is_alive():
        process.kill()
        process.join()
