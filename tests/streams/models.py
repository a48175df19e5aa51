"""Models for the stream tests (importable: worker processes import them by name)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from microbatch import END, ItemError, Model, Started, StepModel


class Counter(StepModel):
    """Item ``"name:n"`` streams ``"name-0"`` ... ``"name-{n-1}"``; ``"name:n:fail@k"``
    fails at step ``k`` (raising: the step is bisected); ``"pid"`` streams the
    worker's process id forever (until its caller leaves), ``"wide"`` 16 KiB strings
    forever (to fill socket buffers in few steps); ``"lock:n"`` a chunk that cannot
    be pickled, ``"alien:n"`` one that cannot be unpickled."""

    gate: threading.Event | None = None  # tests may hold every step at this gate
    steps: list[list[str]] = []  # noqa: RUF012 - the names stepped, per step (thread mode)

    def start(self, items: list[str]) -> list[list[Any]]:
        states = []
        for item in items:
            if item in ("pid", "wide"):
                states.append([item, 1 << 30, None, 0])
                continue
            name, length, *rest = item.split(":")
            fails_at = int(rest[0].removeprefix("fail@")) if rest else None
            states.append([name, int(length), fails_at, 0])
        return states

    def step(self, states: list[list[Any]]) -> tuple[list[Any], list[bool]]:
        if self.gate is not None:
            self.gate.wait()
        type(self).steps.append([state[0] for state in states])
        for name, _, fails_at, position in states:
            if fails_at == position:
                raise ItemError(f"{name} failed at step {position}")
        chunks: list[Any] = []
        for state in states:
            name, _, _, position = state
            chunks.append(_chunk(name, position))
            state[3] = position + 1
        return chunks, [state[3] >= state[1] for state in states]


WIDE = "w" * 16384


class _Alien:
    """Pickles, and raises where it is unpickled (as a class the serving process
    cannot import would)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unreadable, ())


def _unreadable() -> None:
    raise ImportError("no module named 'elsewhere'")


def _chunk(name: str, position: int) -> Any:
    if name == "pid":
        return os.getpid()
    if name == "lock":  # a chunk that cannot be pickled
        return threading.Lock()
    if name == "alien":  # a chunk that pickles here and cannot be unpickled there
        return _Alien()
    return WIDE if name == "wide" else f"{name}-{position}"


class Lockstep(Model):
    """A generator predict: item ``n`` streams ``0 .. n-1``, all items of a batch
    advancing together until the longest ends."""

    def predict(self, batch: list[int]) -> Iterator[list[Any]]:
        for position in range(max(batch)):
            yield [position if position < n else END for n in batch]


class Paced(Counter):
    """:class:`Counter` at a millisecond a step (so that streams overlap, and a
    worker killed mid-way has some of them active)."""

    def step(self, states: list[list[Any]]) -> tuple[list[Any], list[bool]]:
        time.sleep(0.001)
        return super().step(states)


class Echo(StepModel):
    """Item ``b`` (bytes) streams ``b`` once, then its reverse; its ``start`` marks
    the file ``mark`` (when given) before it returns."""

    def __init__(self, mark: str = "") -> None:
        self.mark = mark

    def start(self, items: list[bytes]) -> list[list[Any]]:
        if self.mark:
            with open(self.mark, "w"):
                pass
        return [[item, 0] for item in items]

    def step(self, states: list[list[Any]]) -> tuple[list[bytes], list[bool]]:
        chunks = []
        for state in states:
            chunks.append(state[0] if state[1] == 0 else state[0][::-1])
            state[1] += 1
        return chunks, [state[1] == 2 for state in states]


class Slow(StepModel):
    """Item ``n`` streams ``0 .. n-1``, each step taking 20 ms (for drain tests)."""

    def start(self, items: list[int]) -> list[list[int]]:
        return [[n, 0] for n in items]

    def step(self, states: list[list[int]]) -> tuple[list[int], list[bool]]:
        time.sleep(0.02)
        chunks = []
        for state in states:
            chunks.append(state[1])
            state[1] += 1
        return chunks, [position >= n for n, position in states]


class Name(Model):
    """A one-shot stage before a streaming one: ``n`` -> ``"item{n}:{n}"``."""

    def predict(self, batch: list[int]) -> list[str]:
        return [f"item{n}:{n}" for n in batch]


class Prefilled(StepModel):
    """As :class:`Counter`, but ``start`` makes each item's first chunk itself
    (``Started``), as reading a prompt gives the first token; ``"name:n:fail@0"``
    fails in ``start``, and every call is counted by the names it got (thread mode)."""

    calls: list[tuple[str, list[str]]] = []  # noqa: RUF012 - ("start" | "step", names)

    def start(self, items: list[str]) -> list[Any]:
        type(self).calls.append(("start", [item.split(":")[0] for item in items]))
        started: list[Any] = []
        for item in items:
            name, length, *rest = item.split(":")
            if rest == ["fail@0"]:
                started.append(ItemError(f"{name} failed in start"))
                continue
            state = [name, int(length), 1]
            started.append(Started(state, f"{name}-0", finished=int(length) == 1))
        return started

    def step(self, states: list[list[Any]]) -> tuple[list[Any], list[bool]]:
        type(self).calls.append(("step", [state[0] for state in states]))
        chunks = []
        for state in states:
            chunks.append(f"{state[0]}-{state[2]}")
            state[2] += 1
        return chunks, [state[2] >= state[1] for state in states]
