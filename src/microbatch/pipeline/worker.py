"""The worker process: build the model, then answer batches until told to stop."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ..errors import RemoteError
from ..execution import run_batch
from .model import Model, WorkerContext
from .transport import receive, send

__all__ = ["WorkerSpec", "worker_main"]

READY = "ready"
SETUP_FAILED = "setup-failed"


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, sent to it when it is spawned (must pickle)."""

    model: type[Model]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    context: WorkerContext
    isolate_errors: bool
    env: Mapping[str, str]


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """Entry point of a worker process. Messages: ``(batch_id, items)`` in,
    ``(batch_id, outcomes)`` out; ``None`` in means stop."""
    # The serving process owns shutdown: a signal sent to the whole process group
    # (Ctrl-C in a terminal, a service manager's stop) must not kill a batch midway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ.update(spec.env)
    try:
        model = spec.model(*spec.args, **spec.kwargs)
        model.setup(spec.context)
    except BaseException as exc:
        send(conn, (SETUP_FAILED, RemoteError.from_exception(exc)))
        raise SystemExit(1) from None
    send(conn, (READY, None))
    while True:
        try:
            message = receive(conn)
        except EOFError:  # the serving process is gone
            return
        if message is None:
            return
        batch_id, items = message
        outcomes = run_batch(model.predict, items, spec.isolate_errors)
        send(conn, (batch_id, _portable(outcomes)))


def _portable(outcomes: list[Any]) -> list[Any]:
    """Exceptions become RemoteError, which pickles whatever the original held."""
    return [RemoteError.from_exception(o) if isinstance(o, BaseException) else o for o in outcomes]
