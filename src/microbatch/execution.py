"""Running one batch: per-item results, per-item errors, bisection of failures, and
splitting of batches that ran out of memory.

The plan is written once, without I/O, as a generator: it yields the spans of the
batch to run and is sent each span's result list or the exception it raised. The
asyncio and the thread batcher drive it with an ``await`` or a plain call.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

from .errors import DeadlineExceeded, ResultLengthError
from .oom import MemorySplits

__all__ = [
    "execution_plan",
    "is_async_callable",
    "run_batch",
    "run_batch_async",
    "run_batch_in_time",
    "settle",
]

Span = tuple[int, int]
Plan = Generator[Span, object, list[Any]]


def execution_plan(count: int, isolate_errors: bool, memory: MemorySplits | None = None) -> Plan:
    """Plan the calls that produce one outcome for each of ``count`` items.

    Yields ``(start, stop)`` spans to call the batch function on, and expects to be
    sent that call's result list, or the exception it raised. Returns the outcomes in
    item order; an outcome that is an exception instance is that item's error.

    A span whose call raised is split in halves and each half run again (when
    ``isolate_errors``), down to single items, so one poison item fails alone. A
    result list of the wrong length fails its whole span with ResultLengthError.

    With ``memory``, a span whose call of several items (``memory.running``, set
    by the runner) ran out of memory (see :func:`microbatch.oom.is_out_of_memory`)
    is split in halves whatever ``isolate_errors`` says, and the call recorded in
    ``memory.failed``; an item that runs out of memory alone gets that error as its
    own.
    """
    outcomes: list[Any] = [None] * count
    spans: list[Span] = [(0, count)]
    while spans:
        start, stop = spans.pop()
        reply = yield start, stop
        width = stop - start
        if isinstance(reply, BaseException):
            out_of_memory = memory is not None and len(memory.running) > 1 and memory.matches(reply)
            if out_of_memory:
                memory.failed.append(tuple(memory.running))  # type: ignore[union-attr]
            if (isolate_errors or out_of_memory) and width > 1:
                middle = start + width // 2
                spans.append((middle, stop))
                spans.append((start, middle))
            else:
                outcomes[start:stop] = [reply] * width
            continue
        results = _materialised(reply, width)
        if results is None:
            error = ResultLengthError(
                f"the batch function returned {_describe(reply)} for a batch of {width} items"
            )
            outcomes[start:stop] = [error] * width
        else:
            outcomes[start:stop] = results
    return outcomes


def _materialised(reply: object, width: int) -> list[Any] | None:
    """``reply`` as a list of ``width`` results, or None when it is not one.

    Both its ``len()`` and what iterating it yields must count ``width``: a table
    (a pandas DataFrame) has as many rows as items but iterates its column names.
    """
    if type(reply) is list:
        return reply if len(reply) == width else None
    try:
        length = len(reply)  # type: ignore[arg-type]
        results = list(reply)  # type: ignore[call-overload]
    except TypeError:
        return None
    return results if length == width and len(results) == width else None


def run_batch(
    fn: Callable[[list[Any]], Sequence[Any]],
    items: list[Any],
    isolate_errors: bool,
    wanted: Callable[[int], bool] | None = None,
    memory: MemorySplits | None = None,
) -> list[Any]:
    """Run ``fn`` over ``items`` by :func:`execution_plan`; return the outcomes.

    ``wanted(i)`` tells whether item ``i`` still needs a result; a bisection step
    leaves out the items that no longer do (their caller gave up meanwhile), so an
    expired or cancelled item is never computed again. ``memory`` splits the spans
    that run out of memory and records them.
    """
    reply: object
    if memory is not None:
        memory.running = range(len(items))
    try:
        reply = fn(items)
    except Exception as exc:  # the model's error is this span's outcome
        reply = exc
    if _complete(reply, len(items)):
        return reply  # type: ignore[return-value]
    plan = execution_plan(len(items), isolate_errors, memory)
    next(plan)
    while True:
        call = _next_call(plan, reply, wanted, memory)
        if isinstance(call, list):
            return call
        try:
            reply = call.placed([] if call.empty else fn(call.items(items)))
        except Exception as exc:
            reply = exc


def run_batch_in_time(
    fn: Callable[[list[Any]], Sequence[Any]],
    items: list[Any],
    isolate_errors: bool,
    deadlines: Sequence[float | None],
    clock: Callable[[], float],
) -> list[Any]:
    """:func:`run_batch` for a batch that may have waited after it was formed (in a
    worker's pipe, behind the batch it runs): items whose deadline has passed by
    ``clock()`` are left out, now and between the calls of a bisection, and their
    outcome is :class:`DeadlineExceeded`.
    """
    now = clock()
    keep = [i for i, due in enumerate(deadlines) if due is None or due > now]
    kept = [items[i] for i in keep] if len(keep) < len(items) else items
    due_kept = [deadlines[i] for i in keep]

    def wanted(index: int) -> bool:
        due = due_kept[index]
        return due is None or due > clock()

    results = run_batch(fn, kept, isolate_errors, wanted) if kept else []
    if len(keep) == len(items) and not any(result is UNWANTED for result in results):
        return results
    expired = DeadlineExceeded("the deadline passed while the item waited for a worker")
    outcomes: list[Any] = [expired] * len(items)
    for index, result in zip(keep, results, strict=True):
        outcomes[index] = expired if result is UNWANTED else result
    return outcomes


async def run_batch_async(
    fn: Callable[[list[Any]], Awaitable[Sequence[Any]]],
    items: list[Any],
    isolate_errors: bool,
    wanted: Callable[[int], bool] | None = None,
    memory: MemorySplits | None = None,
) -> list[Any]:
    """Like :func:`run_batch` for a function that returns an awaitable."""
    reply: object
    if memory is not None:
        memory.running = range(len(items))
    try:
        reply = await fn(items)
    except Exception as exc:  # the model's error is this span's outcome
        reply = exc
    if _complete(reply, len(items)):
        return reply  # type: ignore[return-value]
    plan = execution_plan(len(items), isolate_errors, memory)
    next(plan)
    while True:
        call = _next_call(plan, reply, wanted, memory)
        if isinstance(call, list):
            return call
        try:
            reply = call.placed([] if call.empty else await fn(call.items(items)))
        except Exception as exc:
            reply = exc


def _complete(reply: object, count: int) -> bool:
    """Whether ``reply`` is a plain list of ``count`` results with no error among them:
    the common case, which needs no plan."""
    return (
        type(reply) is list
        and len(reply) == count
        and not any(isinstance(result, BaseException) for result in reply)
    )


class _Unwanted:
    """The outcome of an item left out because its caller no longer waits."""

    def __repr__(self) -> str:
        return "<unwanted>"


UNWANTED: Any = _Unwanted()


class _Call:
    """The next call of a plan: a span of the batch, less the items no longer wanted."""

    __slots__ = ("keep", "start", "stop")

    def __init__(self, start: int, stop: int, keep: list[int] | None) -> None:
        self.start, self.stop = start, stop
        self.keep = keep  # None: every item of the span

    @property
    def empty(self) -> bool:
        """No item of the span is wanted: nothing to call."""
        return self.keep == []

    def items(self, batch: list[Any]) -> list[Any]:
        """The items to call the batch function on."""
        if self.keep is None:
            return batch[self.start : self.stop]
        return [batch[i] for i in self.keep]

    def placed(self, results: Sequence[Any]) -> object:
        """The call's results at their places in the span (left-out items UNWANTED)."""
        if self.keep is None:
            return results
        return _spread(results, self.keep, self.start, self.stop)


def _next_call(
    plan: Plan, reply: object, wanted: Callable[[int], bool] | None, memory: MemorySplits | None
) -> _Call | list[Any]:
    """Send the last call's ``reply`` to ``plan``: the next call, or the outcomes."""
    try:
        start, stop = plan.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    keep = _still_wanted(start, stop, wanted)
    if memory is not None:
        memory.running = range(start, stop) if keep is None else keep
    return _Call(start, stop, keep)


def _still_wanted(start: int, stop: int, wanted: Callable[[int], bool] | None) -> list[int] | None:
    """Indexes of the span still wanted, or None when all are."""
    if wanted is None:
        return None
    keep = [i for i in range(start, stop) if wanted(i)]
    return None if len(keep) == stop - start else keep


def _spread(results: Sequence[Any], keep: list[int], start: int, stop: int) -> object:
    """Place the results of the kept items at their positions in the span."""
    try:
        length = len(results)
    except TypeError:
        return results
    if length != len(keep):
        return results  # the plan reports the wrong length
    spread: list[Any] = [UNWANTED] * (stop - start)
    for index, result in zip(keep, results, strict=True):
        spread[index - start] = result
    return spread


def _describe(value: object) -> str:
    try:
        length = len(value)  # type: ignore[arg-type]
        yielded = len(list(value))  # type: ignore[call-overload]
    except TypeError:
        return f"a {type(value).__name__}, not a list"
    if yielded != length:
        return f"{type(value).__name__} of length {length} that iterates {yielded} values"
    return f"{type(value).__name__} of length {length}"


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine (an ``async def`` function or method)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def settle(future: asyncio.Future[Any], outcome: object) -> None:
    """Give ``future`` its outcome (an exception instance is its error), unless it is
    done already (its caller left, or it was settled first)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
