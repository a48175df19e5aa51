"""What a stage runs: a model class, built and set up inside each worker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Model", "StepModel", "WorkerContext"]


@dataclass(frozen=True)
class WorkerContext:
    """Where a model instance runs: its stage's name and its worker index (0-based)."""

    stage: str
    index: int


class Model:
    """Subclass this and implement :meth:`predict`; load weights in :meth:`setup`.

    The class is sent to each worker by reference (it must be importable), built
    there with the stage's ``args``/``kwargs``, set up once, then called with batches.
    """

    def setup(self, worker: WorkerContext) -> None:
        """Runs once in the worker before the first batch: load weights here."""

    def predict(self, batch: list[Any]) -> Sequence[Any]:
        """Return one result per item of ``batch`` (an exception instance fails one item)."""
        raise NotImplementedError(f"{type(self).__name__} must implement predict()")


class StepModel(Model):
    """A model that generates step by step, so that items join and leave its batch
    between two steps (step-wise, or continuous, batching).

    Implement :meth:`start` (an item's state from the item) and :meth:`step` (one
    step over the states of every active item). The states stay where the model
    runs (a worker process or thread); only each step's chunks travel back. Callers
    get the chunks as a stream (``service.stream(item)``); ``service.submit(item)``
    answers the list of an item's chunks.

    The stage's ``max_batch_size`` is the most items active at once; items beyond it
    wait and join at the next step with room.
    """

    def start(self, items: list[Any]) -> Sequence[Any]:
        """Return one state per item of ``items`` (an exception instance fails its
        item; a raise is bisected down to the failing items).

        Where reading an item already gives its first chunk (a prompt's first
        token), return :class:`microbatch.Started` ``(state, chunk)`` for it: its
        caller gets that chunk with this job, and the item's first :meth:`step` is
        in the next one (a step saved where nothing else is active).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement start()")

    def step(self, states: list[Any]) -> tuple[Sequence[Any], Sequence[bool]]:
        """Advance every state by one step; return one chunk per state and whether
        each state is finished (its chunk is its last).

        A chunk that is an exception instance fails its item alone;
        :data:`microbatch.END` finishes an item without a chunk. When the
        call raises, it is run again on halves of ``states`` down to the failing
        one, so a step that raises must leave the states it was given unchanged.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement step()")
