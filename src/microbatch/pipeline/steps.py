"""A stage whose model generates step by step: one step loop per worker, the
items' states kept where the worker runs its model (a thread of this process, or
a worker process), only the chunks coming back.

A :class:`~.model.StepModel` is batched step-wise (items join and leave between
two steps); a model whose ``predict`` is a generator is batched in lockstep (its
batch runs until the longest item ends). Either way each caller gets a stream.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Protocol

from ..errors import StageFailed
from ..stats import StreamStats, StreamStatsRecorder
from ..step_contract import StepDone, StepJob, StepRunner, continuous, lockstep
from ..step_execution import GeneratorSteps, StepExecutor, Steppable
from ..stepping import StepLoop
from ..streams import Channel, Stream
from ..types import BatchDone, BatchJob
from .model import Model, StepModel, WorkerContext
from .model_thread import ModelThread
from .stage import Stage

__all__ = [
    "RunnerFactory",
    "StepStage",
    "ThreadStepRunner",
    "WorkerStepRunner",
    "is_step_model",
    "steppable",
]


def is_step_model(model: type[Model]) -> bool:
    """Whether a stage of ``model`` streams: a StepModel, or a generator ``predict``."""
    return issubclass(model, StepModel) or inspect.isgeneratorfunction(model.predict)


def steppable(model: Model) -> Steppable:
    """``model`` as ``start``/``step``."""
    if isinstance(model, StepModel):
        return model
    return GeneratorSteps(model.predict)  # type: ignore[arg-type]


class ThreadStepRunner:
    """One model instance in a thread of its own, its states held there.

    Each step is handed to the thread at the call to :meth:`advance`, so that the
    step loop hands out the last step's chunks while this one runs.

    Args:
        stage: The stage.
        index: The worker's index.
    """

    def __init__(self, stage: Stage, index: int) -> None:
        self._stage = stage
        self._index = index
        self._thread = ModelThread(f"microbatch-{stage.name}-{index}")
        self._executor: StepExecutor | None = None

    @property
    def restarts(self) -> int:
        """Always 0: a thread does not die and come back."""
        return 0

    @property
    def pids(self) -> list[int]:
        """Empty: the worker is a thread of this process."""
        return []

    async def start(self) -> None:
        """Build and set up the model in its thread.

        Raises:
            Exception: The model's constructor or setup raised.
        """
        self._executor = await self._thread.call(self._build)

    def advance(self, job: StepJob) -> asyncio.Future[StepDone]:
        """Hand one step to the model's thread now; its outcomes come on the future."""
        assert self._executor is not None, "start() the runner first"
        return self._thread.call_now(self._executor.advance, job)

    async def close(self) -> None:
        """Stop the thread (after the running step)."""
        await self._thread.close()

    def _build(self) -> StepExecutor:
        stage = self._stage
        model = stage.model(*stage.args, **stage.kwargs)
        model.setup(WorkerContext(stage.name, self._index))
        return StepExecutor(steppable(model), stage.config.isolate_errors)


class WorkerStepRunner(StepRunner, Protocol):
    """A step runner that owns a worker: started before the first step, closed after
    the last."""

    @property
    def restarts(self) -> int:
        """Times the worker was started again after dying."""

    @property
    def pids(self) -> list[int]:
        """The worker's process id (empty for a thread)."""

    async def start(self) -> None:
        """Start the worker and set up its model."""

    async def close(self) -> None:
        """Stop the worker."""


RunnerFactory = Callable[[Stage, int], WorkerStepRunner]
"""Makes the runner of worker ``index`` of a stage."""


class StepStage:
    """The workers of a streaming stage, one step loop each (the same interface as
    the other worker pools, plus :meth:`open`).

    Each stream goes to the worker with the fewest items active or waiting. The
    stage's ``max_batch_size`` is each worker's ``max_active``; its ``max_queue``
    bounds the items waiting to join, per worker; with a ``cost_fn``, its
    ``max_batch_cost`` bounds the cost of each worker's active items (counted as
    its ``batch_cost`` says), and an item that costs more alone is refused
    (:class:`~microbatch.errors.ItemTooLarge`, HTTP 422) before its stream starts.

    Args:
        stage: The stage (its model a StepModel or with a generator ``predict``).
        runner: Makes the runner of worker ``index`` (default: a thread each).
    """

    def __init__(self, stage: Stage, runner: RunnerFactory | None = None) -> None:
        self.stage = stage
        self._make_runner: RunnerFactory = runner if runner is not None else ThreadStepRunner
        self._runners: list[WorkerStepRunner] = []
        self._loops: list[StepLoop] = []
        self._serving = False

    @property
    def alive(self) -> int:
        """Workers able to take a stream now."""
        return len(self._loops) if self._serving else 0

    @property
    def restarts(self) -> int:
        """Workers started again after dying."""
        return sum(runner.restarts for runner in self._runners)

    @property
    def failure(self) -> StageFailed | None:
        """None: a stage that fails to set up fails the start."""
        return None

    @property
    def pids(self) -> list[int]:
        """Process ids of the worker processes (empty for threads)."""
        return [pid for runner in self._runners for pid in runner.pids]

    async def start(self) -> None:
        """Start every worker and set up its model.

        Raises:
            StageFailed: A model failed to set up.
        """
        config = self.stage.config
        admission = continuous if issubclass(self.stage.model, StepModel) else lockstep
        self._runners = [self._make_runner(self.stage, i) for i in range(self.stage.workers)]
        try:
            await asyncio.gather(*(runner.start() for runner in self._runners))
        except StageFailed:
            raise
        except Exception as error:
            raise StageFailed(
                f"stage {self.stage.name!r}: setup failed: {type(error).__name__}: {error}"
            ) from error
        self._loops = [
            StepLoop(
                runner,
                max_active=config.max_batch_size,
                max_queue=config.max_queue,
                admission=admission,
                name=f"stage {self.stage.name!r}",
                restart=self.stage.idempotent,
                cost_fn=config.cost_fn,
                max_cost=config.max_batch_cost,
                cost_mode=config.batch_cost,
                max_buffered=self.stage.max_buffered_chunks,
                min_joiners=self.stage.min_joiners,
                max_join_wait_s=self.stage.max_join_wait_ms / 1000,
            )
            for runner in self._runners
        ]

    async def warm_up(self, items: list[Any]) -> list[Any]:
        """Stream ``items`` through every worker; return one worker's chunk lists.

        Raises:
            StageFailed: A warm-up item failed.
        """
        outcomes: list[Any] = []
        for loop in self._loops:
            outcomes = await asyncio.gather(
                *(_collect(loop.open(item)) for item in items), return_exceptions=True
            )
            for item, outcome in zip(items, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    raise StageFailed(
                        f"stage {self.stage.name!r}: warm-up item {item!r:.80} failed: {outcome!r}"
                    ) from outcome
        self._serving = True
        return outcomes

    def open(
        self,
        item: Any,
        *,
        deadline: float | None = None,
        first_chunk_deadline: float | None = None,
        on_end: Callable[[Channel], None] | None = None,
    ) -> Stream:
        """Open the stream of ``item`` on the least loaded worker.

        Raises:
            ItemTooLarge: The item alone costs more than ``max_batch_cost``.
            Overloaded: That worker's queue is full.
            BatcherClosed: The stage is closing.
        """
        loop = min(self._loops, key=lambda loop: loop.load)
        return loop.open(
            item, deadline=deadline, first_chunk_deadline=first_chunk_deadline, on_end=on_end
        )

    async def run(self, job: BatchJob) -> BatchDone:
        """Run a batch as streams: each item's outcome is the list of its chunks."""
        streams = [
            self.open(item, deadline=due)
            for item, due in zip(job.items, job.deadlines, strict=True)
        ]
        outcomes = await asyncio.gather(*(_collect(s) for s in streams), return_exceptions=True)
        return BatchDone(list(outcomes))

    def running_since(self) -> float | None:
        """None: a stream stage runs steps, not batches."""
        return None

    def stats(self) -> StreamStats:
        """The stream counters of every worker, added up."""
        snapshots = [loop.stats() for loop in self._loops]
        return _sum_stats(snapshots)

    async def close(self, grace_s: float = 0.0) -> None:
        """Let open streams run for up to ``grace_s``, end the rest, stop the workers."""
        self._serving = False
        await asyncio.gather(*(loop.close(grace_s) for loop in self._loops))
        await asyncio.gather(*(runner.close() for runner in self._runners))
        self._loops, self._runners = [], []


async def _collect(stream: Stream) -> list[Any]:
    return [chunk async for chunk in stream]


def _sum_stats(snapshots: list[StreamStats]) -> StreamStats:
    if not snapshots:
        return StreamStats.of(StreamStatsRecorder(), 0, 0)
    values: dict[str, Any] = {}
    for name in (f.name for f in fields(StreamStats)):
        parts = [getattr(snapshot, name) for snapshot in snapshots]
        if isinstance(parts[0], tuple):
            values[name] = tuple(sum(column) for column in zip(*parts, strict=True))
        else:
            values[name] = sum(parts)
    return StreamStats(**values)
