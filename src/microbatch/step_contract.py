"""What a step loop and the place where a step model's states live exchange, and
who joins a step: the contract between :class:`~microbatch.stepping.StepLoop` and a
:class:`StepRunner` (this process, a worker thread, a worker process).

A step is one :class:`StepJob` (who joins, with their items; who leaves), answered
by one :class:`StepDone` (one chunk, error or :data:`END` per item stepped, or
started with its first chunk: :class:`Started`). An
:data:`AdmissionPolicy` decides how many waiting items join: :func:`continuous`
(step-wise batching) or :func:`lockstep` (a generator ``predict``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "END",
    "AdmissionPolicy",
    "Started",
    "StepDone",
    "StepJob",
    "StepRunner",
    "continuous",
    "lockstep",
]


class _End:
    """The chunk that finishes an item without a chunk of its own."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "microbatch.END"

    def __reduce__(self) -> str:
        return "END"  # one instance, also after crossing a process boundary


END: Any = _End()
"""A step's output (or a generator ``predict``'s element) that finishes its item
without a chunk."""


@dataclass(frozen=True, slots=True)
class Started:
    """What a step model's ``start`` may return for an item instead of its bare
    state: the state, and the item's first chunk made by ``start`` itself (as reading
    a prompt gives the first token). The item then sits out the step of the job
    that started it, so every item still gets one chunk per job; where no other
    item is active (an idle model, a first wave), the job needs no step at all.

    Attributes:
        state: The item's state, for the steps that follow.
        chunk: Its first chunk (:data:`END`: none; an exception instance: its error).
        finished: Whether that chunk is its last (its state is then dropped).
    """

    state: Any
    chunk: Any
    finished: bool = False


@dataclass(frozen=True, slots=True)
class StepJob:
    """One step, from the loop to where the states live.

    Attributes:
        join_keys: Keys of the items that join now (their states are made first).
        join_items: The joining items, in the order of ``join_keys``.
        leave: Keys of the items whose states are to be dropped unstepped (their
            callers left, or their deadline passed).
    """

    join_keys: tuple[int, ...] = ()
    join_items: tuple[Any, ...] = ()
    leave: tuple[int, ...] = ()


@dataclass(slots=True)
class StepDone:
    """One step's outcomes, from where the states live: for each item stepped (or
    failed to join), its key, its chunk (an exception instance: its error; END: no
    chunk), and whether it is finished. A finished or failed item's state is gone.

    Attributes:
        keys: Item keys.
        chunks: One per key.
        finished: One per key.
        started_s: When the step started (``time.monotonic()``), None if nothing ran.
        finished_s: When it was done.
    """

    keys: list[int] = field(default_factory=list)
    chunks: list[Any] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    started_s: float | None = None
    finished_s: float | None = None


class StepRunner(Protocol):
    """Where a step model and its items' states live (this process, a thread, a
    worker process)."""

    def advance(self, job: StepJob) -> Awaitable[StepDone]:
        """Drop ``job.leave``, start ``job.join_*``, step every active item; the
        outcomes come from awaiting what it returns. A runner that steps elsewhere
        (a thread, a worker process) takes the job at the call, so that the step
        runs while the loop hands out the last one's chunks; an ``async def``
        takes it only when awaited (the loop awaits it without letting the event
        loop turn first).

        Raises:
            Exception: The states are lost (a dead worker): every active item of
                this runner fails with this error, and the runner starts afresh.
        """


AdmissionPolicy = Callable[[int, int, int], int]
"""``policy(active, waiting, max_active)``: how many waiting items join now."""


def continuous(active: int, waiting: int, max_active: int) -> int:
    """Every free place is filled at every step (step-wise batching)."""
    return max(0, min(waiting, max_active - active))


def lockstep(active: int, waiting: int, max_active: int) -> int:
    """Items join only an empty batch, which then runs until its last item ends
    (for a generator ``predict``, which cannot take items mid-way)."""
    return min(waiting, max_active) if active == 0 else 0
