"""One batch's part in the timing records of the requests in it: each timed request
gets the stage's entry (queued, behind a running batch, model time, batch size and
cost), and the batch is traced once, linked to every traced request in it."""

from __future__ import annotations

from collections.abc import Sequence

from .timing import Timing

__all__ = ["record_batch"]


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
    behind, model = max(started - released, 0.0), finished - started
    traced = []
    for timing, arrival in timed:
        timing.record(stage, max(released - arrival, 0.0), behind, model, size, cost)
        if timing.span is not None:
            traced.append((timing, arrival))
    if traced:
        first = traced[0][0]
        first.tracer.batch(first.stages[-1].stage, started, finished, size, cost, traced)
