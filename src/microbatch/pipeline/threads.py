"""A stage's worker threads: one model instance per thread, in the serving process.

For models that release the GIL while they compute (numpy, torch, onnxruntime):
no pickling, no process start-up, and the same batching, routing and per-item
errors as a process stage. A thread cannot be killed, so there are no restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from time import monotonic
from typing import Any

from ..errors import BatcherClosed, StageFailed
from ..execution import run_batch, run_batch_in_time
from .model import Model, WorkerContext
from .stage import Stage

__all__ = ["ThreadPool"]

_RETRY_BACKOFF_S = (0.1, 0.5, 2.0)


class ThreadPool:
    """The worker threads of one stage (same interface as :class:`ProcessPool`).

    Args:
        stage: The stage to run (``mode="thread"``).
    """

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self._executor = ThreadPoolExecutor(
            max_workers=stage.workers, thread_name_prefix=f"microbatch-{stage.name}"
        )
        self._models: list[Model] = []
        self._idle: asyncio.Queue[Model] = asyncio.Queue()
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

    async def warm_up(self, items: list[Any]) -> list[Any]:
        """Run ``items`` as one batch through every model, then take batches.

        Raises:
            StageFailed: A warm-up item failed.
        """
        outcomes = await asyncio.gather(*(self._call(model, items) for model in self._models))
        for results in outcomes:
            for item, outcome in zip(items, results, strict=True):
                if isinstance(outcome, BaseException):
                    raise StageFailed(
                        f"stage {self.stage.name!r}: warm-up item {item!r:.80} failed: {outcome!r}"
                    ) from outcome
        for model in self._models:
            self._idle.put_nowait(model)
        self._serving = True
        return outcomes[0] if outcomes else []

    async def run(
        self, items: list[Any], deadlines: Sequence[float | None] | None = None
    ) -> list[Any]:
        """Run one batch on an idle model; return its outcomes (never raises).

        Items whose deadline passed while the batch waited for a model are left out
        (DeadlineExceeded).
        """
        if self._closed:
            return [BatcherClosed(f"stage {self.stage.name!r} is closed")] * len(items)
        model = await self._idle.get()
        try:
            return await self._call(model, items, deadlines)
        finally:
            self._idle.put_nowait(model)

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
                    raise StageFailed(
                        f"stage {self.stage.name!r}: worker {index} failed {attempts} times"
                        f" in setup: {type(exc).__name__}: {exc}"
                    ) from exc
            await asyncio.sleep(_RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)])
        raise AssertionError("unreachable")

    def _build(self, index: int) -> Model:
        model = self.stage.model(*self.stage.args, **self.stage.kwargs)
        model.setup(WorkerContext(self.stage.name, index))
        return model

    async def _call(
        self, model: Model, items: list[Any], deadlines: Sequence[float | None] | None = None
    ) -> list[Any]:
        loop = asyncio.get_running_loop()
        isolate = self.stage.config.isolate_errors
        if deadlines is None:
            call = partial(run_batch, model.predict, items, isolate)
        else:
            call = partial(run_batch_in_time, model.predict, items, isolate, deadlines, monotonic)
        return await loop.run_in_executor(self._executor, call)
