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
    cpus: Sequence[int] | None = None


def worker_main(conn: Connection, pickled_spec: bytes) -> None:
    """Entry point of a worker process. Messages: ``(batch_id, items, deadlines)``
    in (deadlines may be None), ``(batch_id, outcomes)`` out; ``None`` in means stop.
    Items whose deadline has passed are not computed (DeadlineExceeded).

    The spec arrives pickled so that a model that cannot be imported here is
    reported as a setup failure with its reason, not as a bare crash.
    """
    # The serving process owns shutdown: a signal sent to the whole process group
    # (Ctrl-C in a terminal, a service manager's stop) must not kill a batch midway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        spec: WorkerSpec = pickle.loads(pickled_spec)
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
            message = receive(conn)
        except EOFError:  # the serving process is gone
            return
        if message is None:
            return
        batch_id, items, deadlines = message
        if deadlines is None:
            outcomes = run_batch(model.predict, items, spec.isolate_errors)
        else:
            outcomes = run_batch_in_time(
                model.predict, items, spec.isolate_errors, deadlines, time.monotonic
            )
        outcomes = _portable(outcomes)
        try:
            send(conn, (batch_id, outcomes))
        except OSError:  # the serving process is gone: nobody to answer
            return
        except Exception:  # a result that does not pickle: nothing was written yet
            send(conn, (batch_id, [_pickled_or_error(outcome) for outcome in outcomes]))


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
