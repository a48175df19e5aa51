"""Running steps where the model lives: the active items' states, one step over
them with per-item errors (a step that raises is bisected), and a generator
``predict`` seen as steps (lockstep).

Plain, synchronous code: the same object runs in the serving process, in a worker
thread, and in a worker process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from .errors import ResultLengthError
from .execution import run_batch
from .step_contract import END, Started, StepDone, StepJob

__all__ = ["GeneratorSteps", "InlineStepRunner", "StepExecutor", "Steppable"]


class Steppable(Protocol):
    """A model as steps: a state per item, then one step over many states."""

    def start(self, items: list[Any]) -> Sequence[Any]:
        """One state per item (an exception instance fails its item)."""

    def step(self, states: list[Any]) -> tuple[Sequence[Any], Sequence[bool]]:
        """One chunk per state, and whether each is finished."""


class StepExecutor:
    """The states of one model's active items, by key, and the steps over them.

    Args:
        model: The model's ``start`` and ``step``.
        isolate_errors: A ``start`` or ``step`` that raises is run again on halves,
            down to the items that fail, so only they fail.
        clock: Stamps when each step started and finished.
    """

    def __init__(
        self,
        model: Steppable,
        isolate_errors: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._model = model
        self._isolate = isolate_errors
        self._clock = clock
        self._states: dict[int, Any] = {}

    @property
    def active(self) -> int:
        """Items whose state is held."""
        return len(self._states)

    def advance(self, job: StepJob) -> StepDone:
        """Drop the leaving items, start the joining ones, step every active one
        (but those whose start made their first chunk: :class:`Started`)."""
        states = self._states
        for key in job.leave:
            states.pop(key, None)
        done = StepDone(started_s=self._clock())
        began: set[int] = set()  # started with their first chunk: not stepped now
        if job.join_items:
            started = run_batch(self._start_span, list(job.join_items), self._isolate)
            for key, state in zip(job.join_keys, started, strict=True):
                if type(state) is Started:
                    chunk = state.chunk
                    ends = state.finished or chunk is END or isinstance(chunk, BaseException)
                    _add(done, key, chunk, ends)
                    if not ends:
                        states[key] = state.state
                        began.add(key)
                elif isinstance(state, BaseException):
                    _add(done, key, state, True)
                else:
                    states[key] = state
        if len(states) > len(began):
            keys = [key for key in states if key not in began] if began else list(states)
            stepped = run_batch(self._step_span, keys, self._isolate)
            chunks, flags = done.chunks, done.finished
            done.keys.extend(keys)
            for key, outcome in zip(keys, stepped, strict=True):
                if type(outcome) is tuple:  # (chunk, finished), as _step_span makes them
                    chunk, finished = outcome
                    if finished or chunk is END or isinstance(chunk, BaseException):
                        finished = True
                        del states[key]
                else:  # the step's error for this item
                    chunk, finished = outcome, True
                    del states[key]
                chunks.append(chunk)
                flags.append(finished)
        done.finished_s = self._clock()
        return done

    def drop(self, key: int) -> None:
        """Forget the state of ``key`` (if held)."""
        self._states.pop(key, None)

    def clear(self) -> None:
        """Forget every state."""
        self._states.clear()

    def _start_span(self, items: list[Any]) -> Sequence[Any]:
        return self._model.start(items)

    def _step_span(self, keys: list[int]) -> list[tuple[Any, bool]]:
        outputs, finished = self._model.step([self._states[key] for key in keys])
        outputs, finished = list(outputs), list(finished)
        if len(outputs) != len(keys) or len(finished) != len(keys):
            raise ResultLengthError(
                f"step() returned {len(outputs)} chunks and {len(finished)} finished flags"
                f" for {len(keys)} states"
            )
        return list(zip(outputs, map(bool, finished), strict=True))


def _add(done: StepDone, key: int, chunk: Any, finished: bool) -> None:
    done.keys.append(key)
    done.chunks.append(chunk)
    done.finished.append(finished)


class GeneratorSteps:
    """A generator ``predict`` (``predict(batch)`` yields one list per step, one
    element per item of ``batch``: its chunk, :data:`~microbatch.step_contract.END`, or an
    exception instance) seen as steps.

    The items of one call form a cohort that advances together; it runs under the
    :func:`~microbatch.step_contract.lockstep` admission policy, so no item joins a
    cohort mid-way. An error raised by the generator fails every item of its cohort
    (a generator cannot be run again on halves).
    """

    def __init__(self, predict: Callable[[list[Any]], Iterator[Sequence[Any]]]) -> None:
        self._predict = predict

    def start(self, items: list[Any]) -> list[tuple[_Cohort, int]]:
        """The states: the cohort of ``items`` and each item's place in it."""
        cohort = _Cohort(self._predict(items), len(items))
        return [(cohort, index) for index in range(len(items))]

    def step(self, states: list[tuple[_Cohort, int]]) -> tuple[list[Any], list[bool]]:
        """Advance each cohort once; each state's element of its cohort's row."""
        rows: dict[int, Sequence[Any] | BaseException | None] = {}
        outputs: list[Any] = []
        for cohort, index in states:
            if id(cohort) not in rows:
                rows[id(cohort)] = cohort.next_row()
            row = rows[id(cohort)]
            if row is None:  # the generator is exhausted
                outputs.append(END)
            elif isinstance(row, BaseException):
                outputs.append(row)
            else:
                outputs.append(row[index])
        return outputs, [False] * len(states)


class _Cohort:
    """One generator ``predict`` call and how far it got."""

    __slots__ = ("_generator", "_size")

    def __init__(self, generator: Iterator[Sequence[Any]], size: int) -> None:
        self._generator = generator
        self._size = size

    def next_row(self) -> Sequence[Any] | BaseException | None:
        """The next row, the error that ends the cohort, or None at its end."""
        try:
            row = next(self._generator)
        except StopIteration:
            return None
        except Exception as error:
            return error
        try:
            row = list(row)
        except TypeError:
            row = []
        if len(row) != self._size:
            return ResultLengthError(f"predict() yielded {len(row)} values for {self._size} items")
        return row


class InlineStepRunner:
    """A :class:`~microbatch.step_contract.StepRunner` that steps in the calling thread
    (the event loop's): for models that take microseconds per step, and for tests."""

    def __init__(self, executor: StepExecutor) -> None:
        self.executor = executor

    async def advance(self, job: StepJob) -> StepDone:
        """Run the step now."""
        return self.executor.advance(job)
