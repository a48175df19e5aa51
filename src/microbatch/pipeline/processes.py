"""Starting and stopping one worker process, and the serving side's handle on it."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

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


@dataclass(eq=False)
class WorkerHandle:
    """The serving process's view of one worker process."""

    index: int
    process: BaseProcess
    conn: Connection
    set_up: asyncio.Future[None]  # resolved when the model is built and set up
    batches: dict[int, Batch] = field(default_factory=dict)  # sent, by id, oldest first
    alive: bool = True
    serving: bool = False  # warmed up: takes batches


def spawn(
    stage: Stage,
    index: int,
    on_message: Callable[[WorkerHandle], None],
    on_death: Callable[[WorkerHandle], None],
) -> WorkerHandle:
    """Start worker ``index`` of ``stage``; the running loop watches its pipe and sentinel."""
    loop = asyncio.get_running_loop()
    parent, child = _SPAWN.Pipe(duplex=True)
    spec = WorkerSpec(
        stage.model,
        stage.args,
        dict(stage.kwargs),
        WorkerContext(stage.name, index),
        stage.config.isolate_errors,
        stage.env_for(index),
        stage.cpus_for(index),
    )
    process = _SPAWN.Process(
        target=worker_main,
        args=(child, pickle.dumps(spec, protocol=5)),
        name=f"microbatch-{stage.name}-{index}",
        daemon=True,
    )
    process.start()
    child.close()
    worker = WorkerHandle(index, process, parent, loop.create_future())
    loop.add_reader(parent.fileno(), on_message, worker)
    loop.add_reader(process.sentinel, on_death, worker)
    # uvloop (uvicorn's loop) makes a watched descriptor non-blocking; a message is
    # read and written whole, so a pipe that fills half-way must block, not fail.
    os.set_blocking(parent.fileno(), True)
    return worker


def forget(worker: WorkerHandle) -> None:
    """Stop watching a worker's pipe and sentinel, and close its pipe."""
    if worker.conn.closed:
        return
    loop = asyncio.get_running_loop()
    loop.remove_reader(worker.conn.fileno())
    loop.remove_reader(worker.process.sentinel)
    worker.conn.close()


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
