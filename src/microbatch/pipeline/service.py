"""A Service: stages in worker processes, each with its own batching, in sequence."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Protocol

from ..batcher import Batcher
from ..errors import BatcherClosed, Overloaded, StageFailed
from ..merge import row_format
from ..stats import ServiceStats, StageStats
from ..types import BatchDone, BatchJob
from .pool import ProcessPool
from .stage import Stage
from .threads import ThreadPool

__all__ = ["Service", "WorkerPool"]


class WorkerPool(Protocol):
    """What the service needs of a stage's workers (processes or threads)."""

    @property
    def alive(self) -> int:
        """Workers able to take a batch now."""

    @property
    def restarts(self) -> int:
        """Workers started again after dying."""

    @property
    def failure(self) -> StageFailed | None:
        """Why no worker serves, once that is known (None while starting again)."""

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (empty for threads)."""

    async def start(self) -> None:
        """Start the workers and set up their models."""

    async def warm_up(self, items: list[Any]) -> list[Any]:
        """Run ``items`` through every worker; return one worker's outcomes."""

    async def run(self, job: BatchJob) -> BatchDone:
        """Run one batch (see :class:`~microbatch.types.BatchRunner`)."""

    def running_since(self) -> float | None:
        """When the oldest batch running now started, or None."""

    async def close(self) -> None:
        """Stop the workers."""


class Service:
    """One item in, its own result out, through a pipeline of batched stages.

    Each stage runs its model in worker processes and batches with its own
    settings; the results of stage k are the items of stage k + 1. An error in any
    stage goes straight back to its caller; a deadline covers the whole pipeline.

    Args:
        *stages: The stages, in order.
        examples: Items run through the whole pipeline by :meth:`start` (warm-up).
        max_in_flight: Most items inside the service at once; one more gets
            :class:`~microbatch.errors.Overloaded` at once.
        grace_s: How long :meth:`close` lets the items inside finish.
    """

    def __init__(
        self,
        *stages: Stage,
        examples: Sequence[Any] = (),
        max_in_flight: int = 10_000,
        grace_s: float = 30.0,
    ) -> None:
        if not stages:
            raise ValueError("a Service needs at least one Stage")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight!r}")
        self.stages = stages
        self.examples = list(examples)
        self.max_in_flight = max_in_flight
        self.grace_s = grace_s
        self._pools: list[WorkerPool] = [
            ThreadPool(stage) if stage.mode == "thread" else ProcessPool(stage) for stage in stages
        ]
        self._batchers: list[Batcher[Any, Any]] = [
            # A full batch may wait at a worker for the running one (workers queue it),
            # so the worker is told each item's deadline and leaves out expired ones.
            Batcher(
                _batch_function(pool, stage),
                stage.config,
                run_ahead=True,
                pass_deadlines=stage.config.rows is None,
            )
            for pool, stage in zip(self._pools, stages, strict=True)
        ]
        self._steps = list(zip((s.name for s in stages), self._pools, self._batchers, strict=True))
        self._in_flight = 0
        self._started = False
        self._draining = False
        self._emptied: asyncio.Event | None = None  # set when the last item leaves

    @property
    def ready(self) -> bool:
        """Warmed up, not draining, and every stage has a worker that can take a batch."""
        return self._started and not self._draining and all(pool.alive for pool in self._pools)

    @property
    def draining(self) -> bool:
        """:meth:`close` has begun: new items are refused, queued ones finish."""
        return self._draining

    def stats(self) -> ServiceStats:
        """A snapshot of every stage's workers and batching counters."""
        stages = tuple(
            StageStats(
                name=stage.name,
                workers=stage.workers,
                workers_alive=pool.alive,
                restarts=pool.restarts,
                batching=batcher.stats(),
            )
            for stage, pool, batcher in zip(self.stages, self._pools, self._batchers, strict=True)
        )
        return ServiceStats(self.ready, self._draining, self._in_flight, stages)

    def _step_named(self, name: str) -> tuple[str, WorkerPool, Batcher[Any, Any]]:
        for step in self._steps:
            if step[0] == name:
                return step
        raise KeyError(f"no stage named {name!r}")

    @property
    def pools(self) -> Sequence[WorkerPool]:
        """The worker pools, one per stage."""
        return self._pools

    async def start(self) -> None:
        """Start every stage's workers, then warm them up: the examples run as one
        batch through every worker of the first stage, their results through every
        worker of the second, and so on.

        Raises:
            StageFailed: A stage's workers kept dying while setting up, or a
                warm-up example failed.
        """
        try:
            await asyncio.gather(*(pool.start() for pool in self._pools))
            items = self.examples
            for pool in self._pools:
                items = await pool.warm_up(items)
        except BaseException:
            await self.close()
            raise
        self._started = True

    async def submit(
        self,
        item: Any,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
        stage: str | None = None,
    ) -> Any:
        """Run one item through every stage (or through ``stage`` alone: its input in,
        its output out); return its result.

        Raises:
            BatcherClosed: The service is shutting down.
            Overloaded: ``max_in_flight`` items are inside already.
            DeadlineExceeded: The deadline passed (items are dropped before the next
                stage computes them).
            RemoteError: A stage's model failed for this item (type, message, traceback).
            WorkerDied: The worker holding this item died.
            StageFailed: A stage has no live worker now (refused at once), or cannot
                run.
            KeyError: No stage is named ``stage``.
        """
        steps = self._steps if stage is None else (self._step_named(stage),)
        if self._draining:
            raise BatcherClosed("the service is shutting down")
        if not self._started:
            raise BatcherClosed("the service is not started: use `async with service` or start()")
        if self._in_flight >= self.max_in_flight:
            raise Overloaded(f"{self._in_flight} items in flight")
        for name, pool, _ in steps:
            if not pool.alive:  # its workers are starting again, or keep failing
                reason = pool.failure
                raise StageFailed(str(reason) if reason else f"stage {name!r} has no live worker")
        if timeout_s is not None:
            due = time.monotonic() + timeout_s
            deadline = due if deadline is None else min(due, deadline)
        self._in_flight += 1
        try:
            for _, _, batcher in steps:
                item = await batcher.submit(item, deadline=deadline)
            return item
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._emptied is not None:
                self._emptied.set()

    async def close(self) -> None:
        """Stop intake at once, let the items inside finish for up to ``grace_s``
        seconds, answer any still queued :class:`BatcherClosed`, then stop every
        worker (terminate, then kill, one that does not exit)."""
        self._draining = True
        if self._in_flight:
            self._emptied = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), self.grace_s)
        await asyncio.gather(
            *(batcher.close(drain=False) for batcher in self._batchers),
            *(pool.close() for pool in self._pools),
        )

    async def __aenter__(self) -> Service:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


def _batch_function(pool: WorkerPool, stage: Stage) -> Callable[..., Awaitable[Any]]:
    """The batch function the batcher calls, over the pool's ``run(BatchJob)``.

    A bridge until the batcher speaks to a BatchRunner itself: it merges rows before
    the call (so the pool gets one part, all rows) and passes no ``wanted``.
    """
    rows = row_format(stage.config)
    if rows is None:

        async def run(items: list[Any], deadlines: Sequence[float | None]) -> list[Any]:
            done = await pool.run(BatchJob(items, deadlines, _always, len(items)))
            return done.outcomes

        return run

    async def run_merged(merged: Any) -> Any:
        job = BatchJob([merged], [None], _always, max(rows.count(merged), 1))
        (outcome,) = (await pool.run(job)).outcomes
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return run_merged


def _always(index: int) -> bool:
    return True
