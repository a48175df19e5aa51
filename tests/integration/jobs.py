"""Batch jobs for tests that drive a pool (a BatchRunner) directly."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from microbatch.types import BatchJob, BatchRunner


def job(
    items: list[Any],
    deadlines: Sequence[float | None] | None = None,
    wanted: Callable[[int], bool] | None = None,
    units: int | None = None,
) -> BatchJob:
    """A job of ``items`` (no deadlines, every item wanted unless given)."""
    return BatchJob(
        items,
        [None] * len(items) if deadlines is None else deadlines,
        wanted or (lambda index: True),
        len(items) if units is None else units,
    )


async def outcomes(runner: BatchRunner, items: list[Any]) -> list[Any]:
    """Run ``items`` as one batch; their outcomes."""
    return (await runner.run(job(items))).outcomes
