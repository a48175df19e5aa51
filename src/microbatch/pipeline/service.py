"""A Service: stages in worker processes, each with its own batching, in sequence."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from .._hints import item_types
from ..batcher import Batcher
from ..errors import BatcherClosed, Overloaded, StageFailed
from ..policy import QueueState
from ..stats import ServiceStats, StageStats, StatsRecorder
from ..streams import iterate_from_thread
from ..timing import Timing
from ..types import BatchDone, BatchJob, Route, deadline_from
from .admission import Admission, NowaitLane, StreamLane
from .model import Model, StepModel
from .pool import ProcessPool
from .stage import Stage
from .step_worker import ProcessStepRunner
from .steps import StepStage, ThreadStepRunner, is_step_model
from .threads import ThreadPool

__all__ = ["Service", "WorkerPool"]

T = TypeVar("T")
R = TypeVar("R")


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


class Service(Generic[T, R]):
    """One item in, its own result out, through a pipeline of batched stages.

    Each stage runs its model in worker processes (or threads) and batches with its
    own settings; the results of stage k are the items of stage k + 1. An error in
    any stage goes straight back to its caller; a deadline covers the whole pipeline.

    A Service implements :class:`~microbatch.types.Servable`, the contract every
    front door speaks. Its workers exist between :meth:`start` and :meth:`close`
    (or inside ``async with``); it may be started again after it closed, with fresh
    workers.

    Annotate it to have its item and result types checked:
    ``service: Service[str, list[float]] = Service(...)``.

    Args:
        *stages: The stages, in order.
        examples: Items run through the whole pipeline by :meth:`start` (warm-up);
            also the examples of the HTTP API's documentation and of ``microbatch
            bench``.
        max_in_flight: Most items inside the service at once; one more gets
            :class:`~microbatch.errors.Overloaded` at once.
        grace_s: How long :meth:`close` lets the items inside finish.
        name: Shown in logs, metrics and the API (default: the last stage's name).
    """

    def __init__(
        self,
        *stages: Stage,
        examples: Sequence[Any] = (),
        max_in_flight: int = 10_000,
        grace_s: float = 30.0,
        name: str = "",
    ) -> None:
        if not stages:
            raise ValueError("a Service needs at least one Stage")
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be a number >= 0, got {grace_s!r}")
        self.stages = stages
        self.examples: Sequence[Any] = list(examples)
        self.grace_s = grace_s
        self.name = name or stages[-1].name
        self.input_type: Any = _item_types(stages[0].model)[0]
        self.output_type: Any = _item_types(stages[-1].model)[1]
        names = [stage.name for stage in stages]
        several = len(stages) > 1 and len(set(names)) == len(names)
        self.routes: Mapping[str, Route] = (
            {s.name: Route(*_item_types(s.model)) for s in stages} if several else {}
        )
        self._streaming: dict[int, StepStage] = {}  # the stages that stream, by index
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pools: list[WorkerPool] = []
        self._batchers: list[Batcher[Any, Any]] = []
        self._lanes: dict[str | None, NowaitLane] = {}  # the routes submit_nowait takes
        self._stream_lanes: dict[str | None, StreamLane] = {}  # one-stage stream routes
        self._admission = Admission(max_in_flight)  # items inside; draining
        self._started = False

    @property
    def ready(self) -> bool:
        """Warmed up, not draining, and every stage has a worker that can take a batch."""
        return self._started and not self.draining and all(pool.alive for pool in self._pools)

    @property
    def draining(self) -> bool:
        """:meth:`close` has begun: new items are refused, queued ones finish."""
        return self._admission.draining

    @property
    def max_in_flight(self) -> int:
        """Most items inside the service at once (one more gets :class:`Overloaded`)."""
        return self._admission.bound

    @property
    def pools(self) -> Sequence[WorkerPool]:
        """The worker pools, one per stage (empty until :meth:`start`)."""
        return self._pools

    def stats(self) -> ServiceStats:
        """A snapshot of every stage's workers and batching counters."""
        if not self._batchers:  # not started: every counter is zero
            empty = StatsRecorder().snapshot(QueueState())
            stages = tuple(StageStats(s.name, s.workers, 0, 0, empty) for s in self.stages)
            return ServiceStats(False, self.draining, 0, stages)
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
        stages = tuple(
            replace(stats, streams=self._streaming[index].stats())
            if index in self._streaming
            else stats
            for index, stats in enumerate(stages)
        )
        return ServiceStats(self.ready, self.draining, self._admission.inside, stages)

    async def start(self) -> None:
        """Start every stage's workers, then warm them up: the examples run as one
        batch through every worker of the first stage, their results through every
        worker of the second, and so on.

        Raises:
            RuntimeError: The service is running already.
            StageFailed: A stage's workers kept dying while setting up, or a
                warm-up example failed.
        """
        if self._pools:
            raise RuntimeError("the service is running already: close() it before starting again")
        self._admission.draining = False
        self._loop = asyncio.get_running_loop()
        self._pools = [_pool(stage) for stage in self.stages]
        self._streaming = {i: p for i, p in enumerate(self._pools) if isinstance(p, StepStage)}
        pairs = zip(self._pools, self.stages, strict=True)
        self._batchers = [_stage_batcher(pool, stage) for pool, stage in pairs]
        try:
            await asyncio.gather(*(pool.start() for pool in self._pools))
            items = list(self.examples)
            for pool in self._pools:
                items = await pool.warm_up(items)
        except BaseException:
            await self.close()
            raise
        self._started = True
        self._lanes = self._nowait_lanes()
        self._stream_lanes = self._one_stage_streams()

    def _nowait_lanes(self) -> dict[str | None, NowaitLane]:
        """The routes of one stage that neither streams nor needs :meth:`submit`."""
        lanes = {}
        for route in (None, *self.routes):
            steps = self._steps(route)
            if len(steps) == 1 and steps[0] not in self._streaming:
                index = steps[0]
                batcher = self._batchers[index]
                if batcher.accepts_nowait:
                    lanes[route] = NowaitLane(
                        self._admission,
                        batcher,
                        self._pools[index],
                        self.stages[index].name,
                        partial(self._admit, route),
                    )
        return lanes

    def _one_stage_streams(self) -> dict[str | None, StreamLane]:
        """The routes of one stage that streams."""
        lanes = {}
        for route in (None, *self.routes):
            steps = self._steps(route)
            streaming = self._streaming.get(steps[0]) if len(steps) == 1 else None
            if streaming is not None:
                lanes[route] = StreamLane(self._admission, streaming, partial(self._admit, route))
        return lanes

    async def submit(
        self,
        item: T,
        *,
        deadline: float | None = None,
        route: str | None = None,
        timeout_s: float | None = None,
        timing: Timing | None = None,
    ) -> R:
        """Run one item through every stage (or through the stage named ``route``
        alone: its input in, its output out); return its result.

        Args:
            item: The item.
            deadline: Give up at this ``time.monotonic()`` time.
            route: The name of one stage (see :attr:`routes`), or None for all.
            timeout_s: Give up after this many seconds (for in-process callers; the
                earlier of the two counts).
            timing: A record each batched stage appends its entry to (see
                :mod:`microbatch.timing`), or None.

        Raises:
            BatcherClosed: The service is not started, or shutting down.
            Overloaded: ``max_in_flight`` items are inside already.
            DeadlineExceeded: The deadline passed (items are dropped before the next
                stage computes them).
            ItemError: A model refused this item (its status and message).
            RemoteError: A stage's model failed for this item (type, message, traceback).
            WorkerDied: The worker holding this item died.
            StageFailed: A stage has no live worker now (refused at once), or cannot
                run.
            KeyError: No stage is named ``route``.
        """
        steps = self._admit(route)
        if timeout_s is not None:
            deadline = deadline_from(timeout_s, deadline)
        self._admission.entered()
        result: Any = item
        try:
            for index in steps:
                streaming = self._streaming.get(index)
                if streaming is None:
                    if timing is None:
                        result = await self._batchers[index].submit(result, deadline=deadline)
                    else:
                        timing.stage = self.stages[index].name
                        result = await self._batchers[index].submit(
                            result, deadline=deadline, timing=timing
                        )
                else:  # a streaming stage's result: the list of its chunks
                    result = [chunk async for chunk in streaming.open(result, deadline=deadline)]
            return result  # type: ignore[no-any-return]
        finally:
            self._left()

    def submit_nowait(
        self,
        item: T,
        *,
        deadline: float | None = None,
        route: str | None = None,
        timing: Timing | None = None,
    ) -> asyncio.Future[R] | None:
        """:meth:`submit` without a coroutine, for a front that would otherwise make
        a task per request: the future of the item's result, or None where the route
        needs :meth:`submit` (several stages, a streaming stage, or a stage batching
        rows, sizes or costs). Cancelling the future withdraws the item.

        Raises:
            As :meth:`submit`, at once (nothing was queued).
        """
        lane = self._lanes.get(route)
        if lane is None:
            self._admit(route)  # refused at once, as by submit; else submit takes it
            return None
        return lane.submit(item, deadline, timing)

    def can_stream(self, route: str | None = None) -> bool:
        """Whether :meth:`stream` works for ``route``: its (last) stage's model is a
        :class:`~microbatch.StepModel` or has a generator ``predict``.

        Raises:
            KeyError: No stage is named ``route``.
        """
        return is_step_model(self.stages[self._steps(route)[-1]].model)

    def stream(
        self,
        item: T,
        *,
        deadline: float | None = None,
        route: str | None = None,
        first_chunk_deadline: float | None = None,
        timeout_s: float | None = None,
    ) -> AsyncIterator[Any]:
        """Run one item through every stage (or the stage named ``route``); the last
        one streams: its chunks come as they are made.

        ``async for chunk in service.stream(item)``; the item's own error is raised
        from the iteration. A caller that stops early (``aclose()``, ``async with``,
        a cancelled task) frees the item's place at the next step.

        Args:
            item: The item.
            deadline: The whole stream must end by this ``time.monotonic()`` time.
            route: The name of one stage, or None for all.
            first_chunk_deadline: The first chunk must come by this time.
            timeout_s: The whole stream must end within this many seconds.

        Raises:
            TypeError: The (last) stage does not stream.
            BatcherClosed: The service is not started, or shutting down.
            Overloaded: ``max_in_flight`` items are inside, or the stage's queue is full.
            KeyError: No stage is named ``route``.
        """
        lane = self._stream_lanes.get(route)
        if lane is not None:  # one stage, which streams, while the service runs
            if timeout_s is not None:
                deadline = deadline_from(timeout_s, deadline)
            return lane.open(item, deadline, first_chunk_deadline)
        if not self.can_stream(route):
            name = self.stages[self._steps(route)[-1]].name
            raise TypeError(
                f"stage {name!r} does not stream: its model must be a StepModel or have a"
                " generator predict()"
            )
        steps = self._admit(route)  # refused at once while stopped or draining
        if timeout_s is not None:
            deadline = deadline_from(timeout_s, deadline)
        return self._piped(item, steps, deadline, first_chunk_deadline)

    def stream_blocking(
        self,
        item: T,
        *,
        deadline: float | None = None,
        route: str | None = None,
        first_chunk_deadline: float | None = None,
        timeout_s: float | None = None,
    ) -> Iterator[Any]:
        """:meth:`stream` for a thread other than the service's event loop: a plain
        iterator of the chunks (closing it, or leaving its ``for`` loop, leaves the
        stream).

        Raises:
            BatcherClosed: The service is not started.
        """
        loop = self._loop
        if loop is None or not self._started:
            raise BatcherClosed("the service is not started: use `async with service` or start()")
        if timeout_s is not None:
            deadline = deadline_from(timeout_s, deadline)
        return iterate_from_thread(
            lambda: self.stream(
                item, deadline=deadline, route=route, first_chunk_deadline=first_chunk_deadline
            ),
            loop,
        )

    async def _piped(
        self,
        item: Any,
        steps: range | tuple[int],
        deadline: float | None,
        first_chunk_deadline: float | None,
    ) -> AsyncIterator[Any]:
        """The stream of a pipeline: the stages before the last by batches, then the
        last one's chunks."""
        self._admission.entered()
        try:
            result = item
            for index in steps[:-1]:
                result = await self._batchers[index].submit(result, deadline=deadline)
            opened = self._streaming[steps[-1]].open(
                result, deadline=deadline, first_chunk_deadline=first_chunk_deadline
            )
            async with opened as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self._left()

    def _admit(self, route: str | None) -> range | tuple[int]:
        """The stages an item for ``route`` goes through; refused at once when the
        service cannot take it now."""
        if self._admission.draining:
            raise BatcherClosed("the service is shutting down")
        if not self._started:
            raise BatcherClosed("the service is not started: use `async with service` or start()")
        steps = self._steps(route)
        if self._admission.full():
            raise Overloaded(f"{self._admission.inside} items in flight")
        for index in steps:
            pool = self._pools[index]
            if not pool.alive:  # its workers are starting again, or keep failing
                reason = pool.failure
                name = self.stages[index].name
                raise StageFailed(str(reason) if reason else f"stage {name!r} has no live worker")
        return steps

    def _left(self) -> None:
        """One item left the service."""
        self._admission.left()

    async def close(self) -> None:
        """Stop intake at once, let the items inside finish for up to ``grace_s``
        seconds, answer any still queued :class:`BatcherClosed`, then stop every
        worker (terminate, then kill, one that does not exit). The service may be
        started again afterwards."""
        admission = self._admission
        admission.draining = True
        if admission.inside:
            emptied = admission.emptied = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(emptied.wait(), self.grace_s)
            admission.emptied = None
        await asyncio.gather(
            *(batcher.close(drain=False) for batcher in self._batchers),
            *(pool.close() for pool in self._pools),
        )
        self._started = False
        self._pools, self._batchers, self._lanes, self._stream_lanes = [], [], {}, {}

    async def __aenter__(self) -> Service[T, R]:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def _steps(self, route: str | None) -> range | tuple[int]:
        if route is None:
            return range(len(self.stages))
        for index, stage in enumerate(self.stages):
            if stage.name == route and route in self.routes:
                return (index,)
        raise KeyError(f"no route {route!r}")


def _pool(stage: Stage) -> WorkerPool:
    """The workers of ``stage``: step loops for a model that streams."""
    if is_step_model(stage.model):
        return StepStage(stage, ThreadStepRunner if stage.mode == "thread" else ProcessStepRunner)
    return ThreadPool(stage) if stage.mode == "thread" else ProcessPool(stage)


def _item_types(model: type[Model]) -> tuple[Any, Any]:
    """The item and result types of a stage's model (a step model's item type is
    that of ``start``; its results are chunks)."""
    if issubclass(model, StepModel):
        return item_types(model.start)[0], Any
    return item_types(model.predict)


def _stage_batcher(pool: WorkerPool, stage: Stage) -> Batcher[Any, Any]:
    """The batcher in front of one stage's workers."""
    # A full batch may wait at a worker for the running one (workers queue it),
    # so the worker is told each item's deadline and leaves out expired ones.
    return Batcher(config=stage.config, runner=pool)
