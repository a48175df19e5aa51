"""The worker process: build the model, then answer batches until told to stop."""

from __future__ import annotations

import os
import pickle
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ..errors import DeadlineExceeded, RemoteError
from ..execution import run_batch, run_batch_in_time
from .arena import Arena
from .model import Model, WorkerContext
from .transport import read_message, send

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
    cpus: Sequence[int] | None = None
    arena: tuple[str, ...] = ()  # the names of the worker's shared-memory files (none: pipe only)


def worker_main(conn: Connection, pickled_spec: bytes) -> None:
    """Entry point of a worker process. Messages: a batch's ``(items, deadlines)``
    in (deadlines may be None), its ``outcomes`` out, both for the batch's slot;
    ``None`` in means stop. Items whose deadline has passed are not computed
    (DeadlineExceeded).

    The spec arrives pickled so that a model that cannot be imported here is
    reported as a setup failure with its reason, not as a bare crash.
    """
    # The serving process owns shutdown: a signal sent to the whole process group
    # (Ctrl-C in a terminal, a service manager's stop) must not kill a batch midway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    arena: Arena | None = None
    try:
        spec: WorkerSpec = pickle.loads(pickled_spec)
        if spec.arena:  # first: the serving process unlinks the names once we are set up
            arena = Arena.attach(spec.arena)
        os.environ.update(spec.env)
        if spec.cpus is not None:
            os.sched_setaffinity(0, spec.cpus)
        model = spec.model(*spec.args, **spec.kwargs)
        model.setup(spec.context)
    except BaseException as exc:
        send(conn, (SETUP_FAILED, RemoteError.from_exception(exc)))
        raise SystemExit(1) from None
    send(conn, (READY, None))
    while True:
        try:
            message = read_message(conn)
        except EOFError:  # the serving process is gone
            return
        slot = message.slot
        if slot is None:  # only the stop message has no slot
            return
        incoming = None if arena is None else arena.incoming(slot)
        outgoing = None if arena is None else arena.outgoing(slot)
        items, deadlines = message.decode(incoming)
        if deadlines is None:
            outcomes = run_batch(model.predict, items, spec.isolate_errors)
        else:
            outcomes = run_batch_in_time(
                model.predict, items, spec.isolate_errors, deadlines, time.monotonic
            )
        outcomes = _portable(outcomes)
        try:
            send(conn, outcomes, slot, outgoing)
        except OSError:  # the serving process is gone: nobody to answer
            return
        except Exception:  # a result that does not pickle: nothing was written yet
            send(conn, [_pickled_or_error(outcome) for outcome in outcomes], slot, outgoing)


def _portable(outcomes: list[Any]) -> list[Any]:
    """Exceptions become RemoteError, which pickles whatever the original held
    (DeadlineExceeded stays itself: it is ours, and not the model's error)."""
    return [
        RemoteError.from_exception(o)
        if isinstance(o, BaseException) and not isinstance(o, DeadlineExceeded)
        else o
        for o in outcomes
    ]


def _pickled_or_error(outcome: Any) -> Any:
    """The outcome if it pickles, else its own item's error (not the batch's)."""
    try:
        pickle.dumps(outcome, protocol=5, buffer_callback=_discard)
    except Exception as exc:
        reason = f"the result ({type(outcome).__qualname__}) cannot be sent back: {exc}"
        return RemoteError("UnpicklableResult", reason, "")
    return outcome


def _discard(buffer: pickle.PickleBuffer) -> None:
    """Out-of-band buffers need not be copied just to learn that a result pickles."""
