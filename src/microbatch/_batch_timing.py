"""One batch's part in the timing records of the requests in it: each timed request
gets the stage's entry (queued, behind a running batch, model time, batch size and
cost), and the batch is traced once, linked to every traced request in it.

Step-wise batching likewise: a traced stream's record is the current one
(:data:`traced_stream`) while the stream is opened, so that the step loop keeps it
with the stream, and each step with a traced stream in it is traced once
(:func:`record_step`), linked to the span of every traced stream it stepped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Protocol

from .timing import BatchPart, Timing

__all__ = ["record_batch", "record_step", "traced_stream"]

traced_stream: ContextVar[Timing | None] = ContextVar("microbatch_traced_stream", default=None)
"""The record (with its span) of the traced stream being opened now, else None."""


def record_batch(
    stage: str,
    timed: Sequence[tuple[Timing, float]],
    released: float,
    started: float,
    finished: float,
    size: int,
    cost: float | None,
) -> None:
    """Append the batch's entry to each timed request's record, and trace the batch
    when any of them is traced.

    Args:
        stage: The stage's name (a record may carry its own).
        timed: Each timed request's record and the arrival of its item in the batch.
        released: When the batcher let the batch go (queued until then).
        started: When the model started on it (behind a running batch until then).
        finished: When the model finished it.
        size: The batch's size (its rows, with ``rows``).
        cost: The batch's cost, when the batcher measures cost.
    """
    part = BatchPart(stage, released, max(started - released, 0.0), finished - started, size, cost)
    named: dict[str, BatchPart] = {}  # records that carry their own stage name
    traced = []
    for timing, arrival in timed:  # runs for every item: nothing allocated per item
        own = timing.stage
        if own and own != stage:
            if own not in named:
                named[own] = BatchPart(own, released, part.behind_s, part.model_s, size, cost)
            timing.add(named[own], arrival)
        else:
            timing.add(part, arrival)
        if timing.span is not None:
            traced.append((timing, arrival))
    if traced:
        first = traced[0][0]
        first.tracer.batch(first.stages[-1].stage, started, finished, size, cost, traced)


def record_step(loop: str, traced: Mapping[int, Timing], joined: int, step: _Step) -> None:
    """Trace one step, linked to the span of each traced stream it stepped.

    Args:
        loop: The step loop's name.
        traced: The traced streams' records, by stream key.
        joined: How many streams joined at this step.
        step: The step's outcome: the keys of the streams stepped (or that failed
            to join), when it started and finished (nothing ran: nothing is traced).
    """
    started, finished = step.started_s, step.finished_s
    if started is None or finished is None:
        return
    keys = step.keys
    timings = [traced[key] for key in keys if key in traced]
    if timings:
        timings[0].tracer.step(loop, started, finished, len(keys), joined, timings)


class _Step(Protocol):
    """What record_step reads of a :class:`~microbatch.step_contract.StepDone`."""

    @property
    def keys(self) -> Sequence[int]: ...

    @property
    def started_s(self) -> float | None: ...

    @property
    def finished_s(self) -> float | None: ...
