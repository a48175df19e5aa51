"""Running one batch where the model lives (a worker process or a worker thread).

The items whose deadline has passed, or whose caller left, by the time the model
comes to the batch are left out; with rows, the remaining items (each one caller's
part) are merged into one input and the result is split back per part. The runner
stamps when the model really started and finished, for the pool's ledger and the
batcher's cost model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DeadlineExceeded, ItemError, MicrobatchError, RemoteError, ResultLengthError
from ..execution import UNWANTED, run_batch
from ..merge import RowFormat, merged
from ..oom import MemorySplits
from ..types import BatchJob

__all__ = ["LeftOut", "Ran", "computed_units", "left_out", "portable", "run_job"]


class LeftOut(MicrobatchError):
    """The outcome of an item left out because its caller no longer waits (nobody
    reads it: the caller is gone)."""


@dataclass(slots=True)
class Ran:
    """How one batch went where the model lives.

    Attributes:
        outcomes: One per item: a result, or an exception instance.
        started_s: When the model started (``time.monotonic()``); None if every item
            was left out.
        finished_s: When the model finished; None if it never started.
        computed: Items the model ran (the others were left out).
        rows: Rows the model ran (with a row format; else 0).
        out_of_memory: The parts of the batch that ran out of memory and were split,
            each as the positions of its items.
    """

    outcomes: list[Any]
    started_s: float | None
    finished_s: float | None
    computed: int
    rows: int = 0
    out_of_memory: tuple[tuple[int, ...], ...] = ()


def left_out(deadline: float | None, now: float) -> MicrobatchError:
    """The outcome of an item left out at ``now``: expired, or its caller left."""
    if deadline is not None and deadline <= now:
        return DeadlineExceeded("the deadline passed while the item waited for a worker")
    return LeftOut("left out: its caller no longer waits")


def run_job(
    predict: Callable[[Any], Any],
    items: Sequence[Any],
    deadlines: Sequence[float | None] | None,
    wanted: Callable[[int], bool] | None,
    isolate_errors: bool,
    rows: RowFormat | None,
    clock: Callable[[], float],
    on_start: Callable[[float], None] | None = None,
    memory: MemorySplits | None = None,
) -> Ran:
    """Run ``items`` through ``predict`` once (bisecting failures when
    ``isolate_errors``), leaving out the items that expired or are no longer
    ``wanted``, now and between the calls of a bisection.

    With ``rows``, each item is one caller's part: ``predict`` gets the kept parts
    merged into one input, and its result is split back per part (a result of the
    wrong length is a ResultLengthError for each part).

    Args:
        on_start: Called with the start time just before the model starts.
        memory: Split the parts that run out of memory (and report them).
    """
    count = len(items)
    now = clock()
    keep = [i for i in range(count) if _live(i, deadlines, wanted, now)]
    outcomes: list[Any] = [None] * count
    for i in set(range(count)).difference(keep):
        outcomes[i] = left_out(None if deadlines is None else deadlines[i], now)
    if not keep:
        return Ran(outcomes, None, None, 0)
    kept = [items[i] for i in keep] if len(keep) < count else list(items)

    def still(index: int) -> bool:
        return _live(keep[index], deadlines, wanted, clock())

    checked = None if deadlines is None and wanted is None else still
    fn = predict if rows is None else merged(predict, rows)
    started = clock()
    if on_start is not None:
        on_start(started)
    results = run_batch(fn, kept, isolate_errors, checked, memory)
    finished = clock()
    computed = 0
    row_count = 0
    for index, result in zip(keep, results, strict=True):
        if result is UNWANTED:
            outcomes[index] = left_out(None if deadlines is None else deadlines[index], finished)
            continue
        outcomes[index] = result
        computed += 1
        if rows is not None:
            row_count += rows.count(items[index])
    spans: tuple[tuple[int, ...], ...] = ()
    if memory is not None and memory.failed:
        spans = tuple(tuple(keep[i] for i in call) for call in memory.failed)
    return Ran(outcomes, started, finished, computed, row_count, spans)


def computed_units(job: BatchJob, ran: Ran, rows: RowFormat | None) -> int:
    """The units of ``job`` the model really computed: all of them, the rows of the
    parts it ran, or (``size_fn`` units, unknown item by item) the share of its items."""
    count = len(job.items)
    if ran.computed == count:
        return job.units
    if rows is not None:
        return ran.rows
    return -(-job.units * ran.computed // count)  # rounded up


def _live(
    index: int,
    deadlines: Sequence[float | None] | None,
    wanted: Callable[[int], bool] | None,
    now: float,
) -> bool:
    if deadlines is not None:
        due = deadlines[index]
        if due is not None and due <= now:
            return False
    return wanted is None or wanted(index)


def portable(outcomes: list[Any]) -> list[Any]:
    """Outcomes fit to cross a process boundary: a model's exception becomes a
    RemoteError (which pickles whatever the original held); an ItemError stays an
    ItemError, with its message and status (a subclass, which the serving process
    may not import, as the ItemError it is); our own errors stay themselves."""
    return [_portable(outcome) for outcome in outcomes]


def _portable(outcome: Any) -> Any:
    if not isinstance(outcome, BaseException):
        return outcome
    if isinstance(outcome, ItemError):
        if type(outcome) is ItemError:
            return outcome
        try:
            return ItemError(getattr(outcome, "message", str(outcome)), status=outcome.http_status)
        except ValueError:  # a subclass with a status that is not an error status
            return RemoteError.from_exception(outcome)
    if isinstance(outcome, (DeadlineExceeded, LeftOut, ResultLengthError)):
        return outcome
    return RemoteError.from_exception(outcome)
