"""The worker process: build the model, then answer batches until told to stop.

Messages between the serving process and a worker are the small dataclasses below.
A worker reads every message already in its pipe before it starts the next batch,
so that a :class:`Drop` sent while the batch waited behind the running one leaves
its items out. It writes its results with blocking writes: the serving process
reads its pipe whenever there is data, whatever it is writing itself, so a worker
never waits on it for long.
"""

from __future__ import annotations

import math
import pickle
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..errors import RemoteError
from ..merge import RowFormat
from ..oom import MemorySplits
from .arena import Arena
from .jobs import portable, run_job
from .model import Model, WorkerContext
from .transport import read_message, send
from .worker_env import WorkerEnv

if TYPE_CHECKING:
    from .stage import Stage

__all__ = ["Drop", "RunBatch", "SetUp", "Stop", "WorkerSpec", "worker_main"]


@dataclass(frozen=True, slots=True)
class SetUp:
    """Worker to serving process, once: the model is set up, or failed to."""

    error: RemoteError | None = None


@dataclass(frozen=True, slots=True)
class RunBatch:
    """Serving process to worker, on the batch's slot: run these items. The result
    comes back on the same slot as a :class:`~.jobs.Ran`, stamped with the times the
    model started (NaN if it never did) and was done with it."""

    items: list[Any]
    deadlines: Sequence[float | None] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled once per batch: a plain reduce, not the slots dataclass's
        # __getstate__ (a walk over its fields, in Python)
        return (RunBatch, (self.items, self.deadlines))


@dataclass(frozen=True, slots=True)
class Drop:
    """Serving process to worker: leave out these items (positions in its message)
    of the batch in ``slot``, if it has not started yet; their callers left."""

    slot: int
    positions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Stop:
    """Serving process to worker: finish the batches held, then exit."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, sent to it when it is spawned (must pickle)."""

    model: type[Model]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    context: WorkerContext
    isolate_errors: bool
    arena: tuple[str, ...] = ()  # the names of the worker's shared-memory files (none: pipe only)
    rows: RowFormat | None = None  # items are callers' parts of rows, merged for the model
    oom_errors: tuple[type[BaseException], ...] | None = None  # split on OOM (None: never)

    @classmethod
    def of(cls, stage: Stage, index: int, **more: Any) -> WorkerSpec:
        """The spec of worker ``index`` of ``stage``; ``more``: the fields above that
        only a batch worker has."""
        context = WorkerContext(stage.name, index)
        isolate = stage.config.isolate_errors
        return cls(stage.model, stage.args, dict(stage.kwargs), context, isolate, **more)


def worker_main(
    incoming: Connection, outgoing: Connection, env: WorkerEnv, pickled_spec: bytes
) -> None:
    """Entry point of a worker process: :class:`RunBatch` messages in, their
    :class:`~.jobs.Ran` out, until :class:`Stop` (or the serving process is gone).

    ``env`` is applied first, before the spec's model is imported. The spec
    arrives pickled so that a model that cannot be imported here is reported as a
    setup failure with its reason, not as a bare crash.
    """
    # The serving process owns shutdown: a signal sent to the whole process group
    # (Ctrl-C in a terminal, a service manager's stop) must not kill a batch midway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    arena: Arena | None = None
    try:
        env.apply()
        spec: WorkerSpec = pickle.loads(pickled_spec)
        if spec.arena:  # first: the serving process unlinks the names once we are set up
            arena = Arena.attach(spec.arena)
        model = spec.model(*spec.args, **spec.kwargs)
        model.setup(spec.context)
    except BaseException as exc:
        send(outgoing, SetUp(RemoteError.from_exception(exc)))
        raise SystemExit(1) from None
    send(outgoing, SetUp())
    inbox = _Inbox(incoming, arena)
    while True:
        try:
            held = inbox.next_batch()
        except EOFError:  # the serving process is gone
            return
        if held is None:
            return
        slot, batch, dropped = held
        if isinstance(batch, RemoteError):  # the batch cannot be read here: its answer
            send(outgoing, batch, slot, None, (math.nan, time.monotonic()))
            continue
        ran = run_job(
            model.predict,
            batch.items,
            batch.deadlines,
            _keeping(dropped),
            spec.isolate_errors,
            spec.rows,
            time.monotonic,
            memory=None if spec.oom_errors is None else MemorySplits(spec.oom_errors),
        )
        done = time.monotonic() if ran.finished_s is None else ran.finished_s
        times = (math.nan if ran.started_s is None else ran.started_s, done)
        ran.outcomes = portable(ran.outcomes)
        target = None if arena is None else arena.outgoing(slot)
        try:
            send(outgoing, ran, slot, target, times)
        except OSError:  # the serving process is gone: nobody to answer
            return
        except Exception:  # a result that does not pickle: nothing was written yet
            ran.outcomes = [_pickled_or_error(outcome) for outcome in ran.outcomes]
            send(outgoing, ran, slot, target, times)


class _Inbox:
    """The batches a worker holds, in order, and the items dropped from them."""

    def __init__(self, conn: Connection, arena: Arena | None) -> None:
        self._conn = conn
        self._arena = arena
        self._batches: deque[tuple[int, RunBatch | RemoteError]] = deque()
        self._dropped: dict[int, set[int]] = {}
        self._stopping = False

    def next_batch(self) -> tuple[int, RunBatch | RemoteError, set[int]] | None:
        """The next batch to run, its slot and the positions dropped from it, after
        every message already in the pipe; None once told to stop and done. A batch
        that cannot be unpickled here (an item of a class this process cannot import)
        comes as the error that says why.

        Raises:
            EOFError: The serving process is gone.
        """
        while not self._batches and not self._stopping:
            self._take()
        while self._conn.poll(0):
            self._take()
        if not self._batches:
            return None
        slot, batch = self._batches.popleft()
        return slot, batch, self._dropped.pop(slot, set())

    def _take(self) -> None:
        message = read_message(self._conn)
        slot = message.slot
        if slot is not None:
            source = None if self._arena is None else self._arena.incoming(slot)
            try:
                batch = message.decode(source)
            except Exception as exc:
                batch = RemoteError.from_exception(exc)
            self._batches.append((slot, batch))
            return
        order = message.decode(None)
        if isinstance(order, Drop):
            if any(held == order.slot for held, _ in self._batches):
                self._dropped.setdefault(order.slot, set()).update(order.positions)
        elif isinstance(order, Stop):
            self._stopping = True


def _keeping(dropped: set[int]) -> Callable[[int], bool] | None:
    """``wanted`` for a batch with the items at ``dropped`` left out (None: all wanted)."""
    if not dropped:
        return None
    return lambda index: index not in dropped


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
