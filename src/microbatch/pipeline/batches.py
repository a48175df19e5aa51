"""One batch on its way through a worker process: what is sent of it, and what the
batcher learns when it comes back.

Items that are no longer wanted when the batch is sent (their caller left, their
deadline passed) and items that cannot be pickled are not sent: their outcomes are
made here, and the worker gets the rest.
"""

from __future__ import annotations

import asyncio
import math
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import RemoteError
from ..merge import RowFormat
from ..types import BatchDone, BatchJob
from .arena import Segment
from .jobs import Ran, computed_units, left_out
from .pipes import PipeWriter
from .transport import encode, unpicklable
from .worker import Drop, RunBatch

__all__ = ["Batch", "Holder", "decoded", "finished", "prepare", "unwanted"]


class Holder(Protocol):
    """What a batch needs of the worker holding it (a ``processes.WorkerHandle``)."""

    alive: bool
    batches: dict[int, Batch]  # by slot, oldest (the one running) first
    writer: PipeWriter


@dataclass(eq=False)
class Batch:
    """One batch in a pool: its job, the future of how it ran, and which of its
    items went to the worker (the others were answered before)."""

    job: BatchJob
    future: asyncio.Future[Ran]
    retry: bool  # may run once more elsewhere if its worker dies while running it
    sent: list[int] = field(default_factory=list)  # indexes of the items sent, in order
    early: dict[int, Any] = field(default_factory=dict)  # outcomes made here, by index
    worker: Holder | None = None  # where it is held, once sent
    slot: int = -1
    end: int = 0  # where its message ends in the worker's pipe (see PipeWriter.write)
    dropping: list[int] = field(default_factory=list)  # positions to drop, not yet told


def prepare(batch: Batch, slot: int, arena: Segment | None) -> list[bytes | memoryview] | None:
    """The frames that send ``batch`` for ``slot`` (its large parts written into
    ``arena`` now), less the items left out; None if no item is left to send."""
    job, now = batch.job, time.monotonic()
    wanted = job.wanted
    # Drops not yet told name positions in the last sending; the items they name are
    # unwanted, so they are left out below (a batch sent again after its worker died).
    batch.dropping.clear()
    early = batch.early = {
        index: left_out(due, now)
        for index, due in enumerate(job.deadlines)
        if (due is not None and due <= now) or not wanted(index)
    }
    count = len(job.items)
    batch.sent = [i for i in range(count) if i not in early] if early else list(range(count))
    while batch.sent:
        if len(batch.sent) == count:  # the whole batch (as a rule)
            items, deadlines = list(job.items), list(job.deadlines)
        else:
            items = [job.items[i] for i in batch.sent]
            deadlines = [job.deadlines[i] for i in batch.sent]
        dated = deadlines.count(None) < len(deadlines)
        message = RunBatch(items, deadlines if dated else None)
        try:
            return encode(message, slot, arena)
        except Exception as exc:  # an item that does not pickle fails alone
            batch.early.update(_cannot_send(batch.sent, items, exc))
            batch.sent = [i for i in batch.sent if i not in batch.early]
    return None


def finished(batch: Batch, ran: Ran, rows: RowFormat | None) -> BatchDone:
    """What the batcher learns of a batch: every item's outcome, when the model
    started and finished it, and the units it really computed."""
    job = batch.job
    count = len(job.items)
    if len(batch.sent) == count:
        outcomes = ran.outcomes
    else:
        outcomes = [batch.early.get(index) for index in range(count)]
        for index, outcome in zip(batch.sent, ran.outcomes, strict=True):
            outcomes[index] = outcome
    spans = ran.out_of_memory
    if spans and len(batch.sent) != count:  # positions in the message, not in the batch
        spans = tuple(tuple(batch.sent[i] for i in span) for span in spans)
    units = computed_units(job, ran, rows)
    return BatchDone(outcomes, ran.started_s, ran.finished_s, units, spans)


def decoded(batch: Batch, times: tuple[float, float], decode: Callable[[], Any]) -> Ran:
    """A batch's result, or, if it cannot be unpickled here (say, an instance of a
    class the serving process cannot import) or the worker could not unpickle the
    batch, that error for each item sent."""
    try:
        ran = decode()
        if isinstance(ran, Ran) and len(ran.outcomes) == len(batch.sent):
            return ran
        if isinstance(ran, RemoteError):  # the worker could not read the batch
            return Ran([ran] * len(batch.sent), None, None, 0)
        raise TypeError(f"a worker answered {type(ran).__name__}, not the batch's result")
    except Exception as exc:
        error = RemoteError(
            type(exc).__qualname__, f"the result came back but cannot be read: {exc}", ""
        )
        started, done = times
        if math.isnan(started):
            return Ran([error] * len(batch.sent), None, None, 0)
        return Ran([error] * len(batch.sent), started, done, len(batch.sent))


def unwanted(batch: Batch, index: int) -> None:
    """Item ``index``'s caller left (``BatchJob.on_unwanted``): if its batch waits at
    a worker behind the running one, tell the worker to leave the item out (one
    :class:`~.worker.Drop` per batch and loop turn)."""
    worker = batch.worker
    if worker is None or worker.batches.get(batch.slot) is not batch:
        return  # not at a worker (any more)
    if next(iter(worker.batches.values())) is batch:
        return  # running already
    position = bisect_left(batch.sent, index)
    if position < len(batch.sent) and batch.sent[position] == index:
        if not batch.dropping:
            asyncio.get_running_loop().call_soon(_send_drops, batch)
        batch.dropping.append(position)


def _send_drops(batch: Batch) -> None:
    positions, batch.dropping = tuple(batch.dropping), []
    worker = batch.worker
    if not positions:
        return  # the batch was sent again since: those items were left out then
    if worker is not None and worker.alive and worker.batches.get(batch.slot) is batch:
        worker.writer.write(encode(Drop(batch.slot, positions)))


def _cannot_send(sent: list[int], items: list[Any], error: Exception) -> dict[int, Any]:
    """The outcomes of the items that cannot be pickled to a worker, by batch index;
    every item's, if none fails alone (only their mix does)."""
    failed = unpicklable(items) or dict.fromkeys(range(len(items)), error)
    return {
        sent[position]: TypeError(f"the item cannot be sent to a worker process: {reason}")
        for position, reason in failed.items()
    }
