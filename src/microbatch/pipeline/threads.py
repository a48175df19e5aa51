"""A stage's worker threads: one model instance per thread, in the serving process.

For models that release the GIL while they compute (numpy, torch, onnxruntime):
no pickling, no process start-up, and the same batching, routing and per-item
errors as a process stage. A thread cannot be killed, so there are no restarts.
"""

from __future__ import annotations

import asyncio
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from time import monotonic
from typing import Any

from ..errors import BatcherClosed, StageFailed
from ..oom import MemorySplits
from ..types import BatchDone, BatchJob
from .failures import user_frames
from .jobs import Ran, computed_units, run_job
from .model import Model, WorkerContext
from .stage import Stage

__all__ = ["ThreadPool"]

_RETRY_BACKOFF_S = (0.1, 0.5, 2.0)


class ThreadPool:
    """The worker threads of one stage (same interface as :class:`ProcessPool`): a
    :class:`~microbatch.types.BatchRunner`. A batch waits here for an idle model;
    the model's thread stamps when it starts and finishes it.

    Args:
        stage: The stage to run (``mode="thread"``).
    """

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self._executor = ThreadPoolExecutor(
            max_workers=stage.workers, thread_name_prefix=f"microbatch-{stage.name}"
        )
        self._rows = stage.config.row_format()
        self._models: list[Model] = []
        self._idle: asyncio.Queue[int] = asyncio.Queue()  # indexes of idle models
        self._since: list[float | None] = [None] * stage.workers  # per model: running since
        self._serving = False
        self._closed = False

    @property
    def restarts(self) -> int:
        """Always 0: a thread does not die and come back."""
        return 0

    @property
    def alive(self) -> int:
        """Workers able to take a batch now."""
        return len(self._models) if self._serving and not self._closed else 0

    @property
    def failure(self) -> StageFailed | None:
        """None: a thread stage that fails to set up fails the start."""
        return None

    @property
    def pids(self) -> list[int]:
        """Empty: the workers are threads of this process."""
        return []

    async def start(self) -> None:
        """Build and set up one model per worker, in the worker threads.

        Raises:
            StageFailed: A model's setup kept failing.
        """
        self._models = list(
            await asyncio.gather(*(self._set_up(index) for index in range(self.stage.workers)))
        )

    def running_since(self) -> float | None:
        """When the oldest batch running now started (``time.monotonic()``), or None."""
        since = [at for at in self._since if at is not None]
        return min(since) if since else None

    async def warm_up(self, items: list[Any]) -> list[Any]:
        """Run ``items`` as one batch through every model, then take batches.

        Raises:
            StageFailed: A warm-up item failed.
        """
        job = BatchJob(items, [None] * len(items), _always, len(items))
        outcomes = await asyncio.gather(
            *(self._call(index, job) for index in range(len(self._models)))
        )
        for ran in outcomes:
            for item, outcome in zip(items, ran.outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    raise StageFailed(
                        f"stage {self.stage.name!r}: warm-up item {item!r:.80} failed: {outcome!r}"
                    ) from outcome
        for index in range(len(self._models)):
            self._idle.put_nowait(index)
        self._serving = True
        return outcomes[0].outcomes if outcomes else []

    async def run(self, job: BatchJob) -> BatchDone:
        """Run one batch on an idle model; return its outcomes and when the model
        started and finished it (never raises).

        Items whose caller left or whose deadline passed while the batch waited for a
        model are left out (DeadlineExceeded for an expired one).
        """
        count = len(job.items)
        if self._closed:
            return BatchDone([BatcherClosed(f"stage {self.stage.name!r} is closed")] * count)
        index = await self._idle.get()
        try:
            if self._closed:  # closed while it waited: the threads are stopping
                return BatchDone([BatcherClosed(f"stage {self.stage.name!r} is closed")] * count)
            ran = await self._call(index, job)
        finally:
            self._idle.put_nowait(index)
        return BatchDone(
            ran.outcomes,
            ran.started_s,
            ran.finished_s,
            computed_units(job, ran, self._rows),
            ran.out_of_memory,
        )

    async def close(self) -> None:
        """Let running batches finish, then stop the threads."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    async def _set_up(self, index: int) -> Model:
        loop = asyncio.get_running_loop()
        attempts = self.stage.setup_attempts
        for attempt in range(attempts):
            try:
                return await loop.run_in_executor(self._executor, self._build, index)
            except Exception as exc:
                if attempt + 1 == attempts:
                    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                    raise StageFailed(
                        f"stage {self.stage.name!r}: worker {index} failed {attempts} times"
                        f" in setup: {type(exc).__name__}: {exc}\n{user_frames(text)}"
                    ) from exc
            await asyncio.sleep(_RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)])
        raise AssertionError("unreachable")

    def _build(self, index: int) -> Model:
        model = self.stage.model(*self.stage.args, **self.stage.kwargs)
        model.setup(WorkerContext(self.stage.name, index))
        return model

    async def _call(self, index: int, job: BatchJob) -> Ran:
        """Run ``job`` on model ``index`` in its thread."""

        def started(at: float) -> None:
            self._since[index] = at

        call = partial(
            run_job,
            self._models[index].predict,
            job.items,
            job.deadlines,
            job.wanted,
            self.stage.config.isolate_errors,
            self._rows,
            monotonic,
            started,
            memory=_memory_splits(self.stage),
        )
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)
        finally:
            self._since[index] = None


def _memory_splits(stage: Stage) -> MemorySplits | None:
    config = stage.config
    return MemorySplits(config.oom_errors) if config.split_on_oom else None


def _always(index: int) -> bool:
    return True
