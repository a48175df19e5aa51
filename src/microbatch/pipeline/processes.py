"""Starting and stopping one worker process, and the serving side's handle on it."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from .arena import Arena
from .model import WorkerContext
from .stage import Stage
from .worker import WorkerSpec, worker_main

__all__ = ["Batch", "WorkerHandle", "has_data", "spawn", "stop"]

_SPAWN = multiprocessing.get_context("spawn")
_STOP_GRACE_S = 5.0


@dataclass(eq=False)
class Batch:
    """One batch on its way through a worker: its items and the future of its outcomes."""

    items: list[Any]
    future: asyncio.Future[list[Any]]
    retry: bool  # may run once more elsewhere if its worker dies while running it
    deadlines: Sequence[float | None] | None = None  # the worker leaves out expired items


@dataclass(eq=False)
class WorkerHandle:
    """The serving process's view of one worker process."""

    index: int
    process: BaseProcess
    conn: Connection
    set_up: asyncio.Future[None]  # resolved when the model is built and set up
    arena: Arena | None = None  # its shared memory (None: everything goes by pipe)
    batches: dict[int, Batch] = field(default_factory=dict)  # sent, by slot, oldest first
    receiving: dict[int, Batch] = field(default_factory=dict)  # answered, being copied out
    alive: bool = True
    serving: bool = False  # warmed up: takes batches

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
    parent, child = _SPAWN.Pipe(duplex=True)
    spec = WorkerSpec(
        stage.model,
        stage.args,
        dict(stage.kwargs),
        WorkerContext(stage.name, index),
        stage.config.isolate_errors,
        stage.env_for(index),
        stage.cpus_for(index),
        () if arena is None else arena.names,
    )
    process = _SPAWN.Process(
        target=worker_main,
        args=(child, pickle.dumps(spec, protocol=5)),
        name=f"microbatch-{stage.name}-{index}",
        daemon=True,
    )
    try:
        process.start()
    except BaseException:
        if arena is not None:
            arena.close()
        parent.close()
        raise
    finally:
        child.close()
    worker = WorkerHandle(index, process, parent, loop.create_future(), arena)
    loop.add_reader(parent.fileno(), on_message, worker)
    # uvloop makes a watched descriptor non-blocking, but messages are read whole: a
    # read that found half a message would fail with BlockingIOError.
    os.set_blocking(parent.fileno(), True)
    loop.add_reader(process.sentinel, on_death, worker)
    return worker


def forget(worker: WorkerHandle) -> None:
    """Stop watching a worker's pipe and sentinel, close its pipe and its arena."""
    if worker.conn.closed:
        return
    loop = asyncio.get_running_loop()
    loop.remove_reader(worker.conn.fileno())
    loop.remove_reader(worker.process.sentinel)
    worker.conn.close()
    if worker.arena is not None:
        worker.arena.close()


def stop(process: BaseProcess) -> None:
    """Wait for a worker to exit; kill it if it does not (blocking). Workers ignore
    SIGTERM (a group-wide stop must not cut a batch), so there is no terminate step."""
    process.join(_STOP_GRACE_S)
    if process.is_alive():
        process.kill()
        process.join()


def has_data(conn: Connection) -> bool:
    """Whether a message (or the end of the pipe) is waiting to be read."""
    try:
        return conn.poll(0)
    except (OSError, EOFError):
        return False
