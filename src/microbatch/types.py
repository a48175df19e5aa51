"""The vocabulary every layer speaks: the one contract of a served model, deadlines,
and the messages between a batcher and whatever runs its batches.

A front door (an in-process call, an HTTP route, the ``serve --workers`` hub, a Ray
replica, and every protocol to come) depends on :class:`Servable` alone. The deadline
of a request is worked out once, where the request enters, by :func:`deadline_from`,
and carried down as a ``time.monotonic()`` time; no layer below recomputes it.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from .stats import ServiceStats

__all__ = [
    "BatchDone",
    "BatchJob",
    "BatchRunner",
    "BeginsBatches",
    "Route",
    "Servable",
    "StreamingServable",
    "deadline_from",
]

T_contra = TypeVar("T_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)


def deadline_from(
    timeout_s: float | None = None,
    deadline: float | None = None,
    *,
    default_timeout_s: float | None = None,
    now: Callable[[], float] = time.monotonic,
) -> float | None:
    """The deadline of a request entering now: the earlier of ``deadline`` and
    ``now() + timeout_s`` (``default_timeout_s`` when no ``timeout_s`` is given).

    This is the only place a deadline is worked out; everything below takes the
    result as it is.

    Args:
        timeout_s: Seconds from now the caller will wait, or None.
        deadline: A ``time.monotonic()`` time the caller will wait until, or None.
        default_timeout_s: The front door's default timeout, used without ``timeout_s``.
        now: The clock (``time.monotonic`` scale).

    Returns:
        A ``time.monotonic()`` time, or None for no deadline.

    Raises:
        ValueError: ``timeout_s`` is negative or not a number.
    """
    if timeout_s is None:
        timeout_s = default_timeout_s
    if timeout_s is None:
        return deadline
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not (timeout_s >= 0)
    ):
        raise ValueError(f"timeout_s must be a number >= 0, got {timeout_s!r}")
    if math.isinf(timeout_s):
        return deadline
    due = now() + timeout_s
    return due if deadline is None else min(due, deadline)


class Route(NamedTuple):
    """One more entry point of a servable besides the whole model (for a Service of
    several stages: each stage alone), with its own item and result types."""

    input_type: Any
    output_type: Any


@runtime_checkable
class Servable(Protocol[T_contra, R_co]):
    """The one contract every front door speaks: a model that takes one item at a
    time and gives each caller its own result.

    :class:`~microbatch.Service` and ``@microbatch.batch`` functions implement it.
    A servable that can also stream its results speaks :class:`StreamingServable`.
    """

    @property
    def name(self) -> str:
        """Shown in logs, metrics and OpenAPI."""

    @property
    def input_type(self) -> Any:
        """The declared type of one item (``Any`` when not declared)."""

    @property
    def output_type(self) -> Any:
        """The declared type of one result (``Any`` when not declared)."""

    @property
    def routes(self) -> Mapping[str, Route]:
        """More entry points than the whole model, by name (may be empty)."""

    @property
    def examples(self) -> Sequence[Any]:
        """Example items (warm-up, OpenAPI, ``microbatch bench`` bodies)."""

    @property
    def ready(self) -> bool:
        """Started, not draining, and able to take items now."""

    async def start(self) -> None:
        """Start workers and warm up."""

    def close(self) -> Awaitable[None]:
        """Refuse new items, finish the ones inside, stop workers (await it; an
        ``async def close`` is one)."""

    async def submit(
        self, item: T_contra, *, deadline: float | None = None, route: str | None = None
    ) -> R_co:
        """One item in (to the whole model, or to one of :attr:`routes`), its own
        result out, or its own error raised.

        Args:
            item: The item, already decoded and validated.
            deadline: A ``time.monotonic()`` time, from :func:`deadline_from`.
            route: One of :attr:`routes`, or None for the whole model.

        A servable may also take ``timing=`` (a :class:`~microbatch.timing.Timing`
        record, default None) and append one entry per batch the item went
        through: front doors pass it (for ``Server-Timing``) only where
        :func:`~microbatch.timing.accepts_timing` says so. Every in-tree servable
        does; one without it still works, without per-request timings.
        """

    def stats(self) -> ServiceStats:
        """A snapshot of the counters of every stage."""


@runtime_checkable
class StreamingServable(Servable[T_contra, R_co], Protocol[T_contra, R_co]):
    """A :class:`Servable` whose results may come as streams of chunks (a model that
    generates step by step). :class:`~microbatch.Service` speaks it; front doors
    ask :meth:`can_stream` before they offer a stream.
    """

    def can_stream(self, route: str | None = None) -> bool:
        """Whether :meth:`stream` works for ``route`` (None: the whole model)."""

    def stream(
        self,
        item: T_contra,
        *,
        deadline: float | None = None,
        route: str | None = None,
        first_chunk_deadline: float | None = None,
    ) -> AsyncIterator[Any]:
        """One item in, its chunks out as they come, then its end (or its own error,
        raised from the iteration). Stopping the iteration early (``aclose()``, a
        cancelled task) frees the item's place at the next step.

        Args:
            item: The item, already decoded and validated.
            deadline: The whole stream must end by this ``time.monotonic()`` time.
            route: One of :attr:`routes`, or None for the whole model.
            first_chunk_deadline: The first chunk must come by this time.

        Raises:
            Overloaded: Too many items inside: refused before the stream starts.
            BatcherClosed: Not started, or shutting down.
            TypeError: The model (or the route) does not stream.
        """


# -- between a batcher and what runs its batches ------------------------------------


@dataclass(slots=True)
class BatchJob:
    """One batch handed to a :class:`BatchRunner`.

    Attributes:
        items: The items, in order.
        deadlines: Each item's deadline (``time.monotonic()``) or None.
        wanted: ``wanted(i)`` is False once item ``i``'s caller no longer waits
            (cancelled, or its deadline passed): a runner that starts the batch later
            than it got it leaves such items out.
        units: The batch's size in batch units (items, rows or ``size_fn`` units).
        on_unwanted: Set by the runner while it holds the batch; the batcher calls
            it with ``i`` when item ``i``'s caller leaves (or its deadline passes), so
            that a runner holding the batch behind a running one (a worker pool) can
            leave the item out before the model starts, without polling ``wanted``.

    With ``rows``, each item is one caller's part (a sequence of rows), not merged:
    the runner merges the parts it runs and splits the result back.
    """

    items: list[Any]
    deadlines: Sequence[float | None]
    wanted: Callable[[int], bool]
    units: int
    on_unwanted: Callable[[int], None] | None = None


@dataclass(slots=True)
class BatchDone:
    """What a :class:`BatchRunner` reports for one batch.

    Attributes:
        outcomes: One per item: its result, or an exception instance for its error.
        started_s: When the model really started on the batch (``time.monotonic()``),
            or None if it never ran (every item was left out, or the worker died first).
        finished_s: When the model finished it, or None if it never ran.
        units: The units the model really computed (items left out do not count).
        out_of_memory: The parts of the batch that ran out of memory and were split,
            each as the positions of its items in the batch.
    """

    outcomes: list[Any]
    started_s: float | None = None
    finished_s: float | None = None
    units: int = 0
    out_of_memory: tuple[tuple[int, ...], ...] = ()


class BatchRunner(Protocol):
    """Runs batches somewhere else (worker processes, threads) and owns the ledger of
    the batches it holds: when each one really starts and ends.

    The batcher hands it at most ``max_concurrent_batches`` batches to run and, with
    run-ahead, one more per slot to start the moment a running one ends; it learns
    the cost model from ``finished_s - started_s`` over ``units`` of each report, and,
    while every slot is busy, reads :meth:`running_since`."""

    async def run(self, job: BatchJob) -> BatchDone:
        """Run one batch; never raise for the batch as a whole (a dead worker or a
        failed stage is every item's outcome)."""

    def running_since(self) -> float | None:
        """When the oldest batch running now started, or None if none runs."""


@runtime_checkable
class BeginsBatches(Protocol):
    """A runner that can also hand over a batch without a task: ``begin`` sends it
    now and calls ``on_done`` with the :class:`~microbatch.types.BatchDone` that
    ``run`` would return, once, from the event loop, never from within ``begin``
    (a process pool: the result is reported in the loop round it is read)."""

    def begin(self, job: BatchJob, on_done: Callable[[BatchDone], None]) -> None:
        """Hand ``job`` over; report how it went to ``on_done``."""
