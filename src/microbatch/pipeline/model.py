"""What a stage runs: a model class, built and set up inside each worker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Model", "WorkerContext"]


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
