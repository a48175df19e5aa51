"""A user's batch function as a :class:`~microbatch.types.BatchRunner`, so that the
asyncio batcher has one execution path whatever runs its batches.

An ``async def`` function is awaited in the event loop; a plain function runs in a
thread pool of one thread per slot, the thread stamping the batch's own start and
finish (a batch handed over while every thread is busy waits in the pool, and its
wait is not counted as its run time). With rows, the runner merges the callers'
parts into one input and splits the result back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .errors import MicrobatchError
from .execution import is_async_callable, run_batch, run_batch_async
from .merge import RowFormat, merged, merged_async
from .oom import MemorySplits
from .types import BatchDone, BatchJob

__all__ = ["FunctionRunner", "function_runner"]


class _LeftOut(MicrobatchError):
    """The outcome of an item a runner left out: its caller no longer waits."""


def function_runner(
    fn: Callable[[Any], Any],
    *,
    isolate_errors: bool,
    rows: RowFormat | None,
    size_of: Callable[[Any], int],
    now: Callable[[], float],
    threads: int,
    memory: Callable[[], MemorySplits | None] = lambda: None,
) -> FunctionRunner:
    """The runner for ``fn``: awaited in the loop, or run in ``threads`` threads.
    ``memory`` makes each batch's record of out-of-memory splits (None: no splits)."""
    if is_async_callable(fn):
        merged_fn = fn if rows is None else merged_async(fn, rows)
        return _AsyncRunner(merged_fn, isolate_errors, size_of, now, memory)
    return _ThreadRunner(
        fn if rows is None else merged(fn, rows),
        isolate_errors,
        size_of,
        now,
        memory,
        threads=threads,
    )


class FunctionRunner:
    """What the two runners share: the ledger of running batches, leaving out the
    items nobody waits for, and the report."""

    queues_batches = False
    """Whether a batch handed over while all slots are busy waits for one (a thread
    pool queues it; an ``async`` function would run it at once, one too many)."""

    def __init__(
        self,
        fn: Callable[[list[Any]], Any],
        isolate_errors: bool,
        size_of: Callable[[Any], int],
        now: Callable[[], float],
        memory: Callable[[], MemorySplits | None],
    ) -> None:
        self._memory = memory
        self._fn = fn  # rows already merged: it takes and returns whole lists
        self._isolate = isolate_errors
        self._size_of = size_of
        self._now = now
        self._running: dict[int, float] = {}  # batch number -> when it started
        self._numbers = itertools.count()
        self._ledger = threading.Lock()  # the thread runner writes it from its threads

    def running_since(self) -> float | None:
        """When the oldest batch running now started, or None if none runs."""
        with self._ledger:
            return min(self._running.values(), default=None)

    async def run(self, job: BatchJob) -> BatchDone:
        """Run one batch (see :class:`~microbatch.types.BatchRunner`)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the runner holds (its threads)."""

    def _started(self) -> tuple[int, float]:
        number, started = next(self._numbers), self._now()
        with self._ledger:
            self._running[number] = started
        return number, started

    def _finished(self, number: int) -> float:
        finished = self._now()
        with self._ledger:
            del self._running[number]
        return finished

    def _select(self, job: BatchJob) -> tuple[list[int] | None, list[Any], Callable[[int], bool]]:
        """The wanted items: (their indexes, or None for all; the items; wanted())."""
        items, wanted = job.items, job.wanted
        keep = [index for index in range(len(items)) if wanted(index)]
        if len(keep) == len(items):
            return None, items, wanted
        return keep, [items[index] for index in keep], lambda index: wanted(keep[index])

    def _report(
        self,
        job: BatchJob,
        keep: list[int] | None,
        outcomes: list[Any],
        started: float | None,
        finished: float | None,
        memory: MemorySplits | None = None,
    ) -> BatchDone:
        spans: tuple[tuple[int, ...], ...] = ()
        if memory is not None and memory.failed:
            spans = tuple(
                tuple(i if keep is None else keep[i] for i in call) for call in memory.failed
            )
        if keep is None:
            return BatchDone(outcomes, started, finished, job.units, spans)
        placed: list[Any] = [_LeftOut("its caller no longer waits")] * len(job.items)
        for index, outcome in zip(keep, outcomes, strict=True):
            placed[index] = outcome
        units = sum(self._size_of(job.items[index]) for index in keep)
        return BatchDone(placed, started, finished, units, spans)


class _AsyncRunner(FunctionRunner):
    """An ``async def`` batch function, awaited in the event loop."""

    async def run(self, job: BatchJob) -> BatchDone:
        """Run the wanted items of the batch; report when it started and ended."""
        keep, items, wanted = self._select(job)
        if not items:
            return self._report(job, keep, [], None, None)
        number, started = self._started()
        memory = self._memory()
        try:
            outcomes = await run_batch_async(self._fn, items, self._isolate, wanted, memory)
        finally:
            finished = self._finished(number)
        return self._report(job, keep, outcomes, started, finished, memory)


class _ThreadRunner(FunctionRunner):
    """A plain batch function, run in a thread pool with one thread per slot."""

    queues_batches = True

    def __init__(self, *args: Any, threads: int) -> None:
        super().__init__(*args)
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, job: BatchJob) -> BatchDone:
        """Hand the batch to the pool; the thread that runs it stamps its times."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[BatchDone] = loop.create_future()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="microbatch")
        self._executor.submit(self._work, job, loop, future)
        return await future

    def close(self) -> None:
        """Let the pool's threads end once their batches are done."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def _work(
        self, job: BatchJob, loop: asyncio.AbstractEventLoop, future: asyncio.Future[BatchDone]
    ) -> None:
        """In a pool thread: run the batch, hand the report (or what escaped) back."""
        result: BatchDone | BaseException
        try:
            keep, items, wanted = self._select(job)
            if not items:
                result = self._report(job, keep, [], None, None)
            else:
                number, started = self._started()
                memory = self._memory()
                try:
                    outcomes = run_batch(self._fn, items, self._isolate, wanted, memory)
                finally:
                    finished = self._finished(number)
                result = self._report(job, keep, outcomes, started, finished, memory)
        except BaseException as exc:  # handed to the loop, which fails the batch
            result = exc
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(_resolve, future, result)


def _resolve(future: asyncio.Future[BatchDone], result: BatchDone | BaseException) -> None:
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    elif isinstance(result, BaseException):  # not raised in the loop: it would stop it
        error = MicrobatchError(f"the batch was aborted: {result!r}")
        error.__cause__ = result
        future.set_exception(error)
    else:
        future.set_result(result)
