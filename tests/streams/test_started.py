"""A step model's ``start`` may make an item's first chunk itself (``Started``):
the item sits out the step of the job that started it, so its first chunk comes a
step sooner, and every item still gets one chunk per job."""

from __future__ import annotations

import asyncio

import pytest

from microbatch import END, ItemError, Service, Stage, Started
from microbatch.step_execution import StepExecutor
from microbatch.stepping import StepJob

from .models import Prefilled


class Mixed:
    """``"s..."`` items start with their first chunk, the others with a bare state."""

    def __init__(self) -> None:
        self.stepped: list[list[str]] = []

    def start(self, items: list[str]) -> list[object]:
        return [Started([item, 1], f"{item}-0") if item[0] == "s" else [item, 0] for item in items]

    def step(self, states: list[list[object]]) -> tuple[list[str], list[bool]]:
        self.stepped.append([str(state[0]) for state in states])
        chunks = []
        for state in states:
            chunks.append(f"{state[0]}-{state[1]}")
            state[1] = int(str(state[1])) + 1
        return chunks, [False] * len(states)


def test_an_item_started_with_its_chunk_sits_out_that_jobs_step_only() -> None:
    model = Mixed()
    executor = StepExecutor(model)
    first = executor.advance(StepJob((1, 2), ("s1", "p2")))
    assert dict(zip(first.keys, first.chunks, strict=True)) == {1: "s1-0", 2: "p2-0"}
    assert model.stepped == [["p2"]]  # s1 made its chunk in start
    second = executor.advance(StepJob((3,), ("s3",)))
    assert dict(zip(second.keys, second.chunks, strict=True)) == {
        1: "s1-1",
        2: "p2-1",
        3: "s3-0",
    }
    assert model.stepped[-1] == ["s1", "p2"]
    assert executor.active == 3


@pytest.mark.parametrize(
    ("started", "chunks", "held"),
    [
        (Started("state", "last", finished=True), ["last"], 0),
        (Started("state", END), [END], 0),
        (Started("state", ItemError("bad prompt")), ["ItemError"], 0),
        (Started("state", "first"), ["first"], 1),
    ],
)
def test_a_first_chunk_that_ends_its_item_drops_its_state(
    started: Started, chunks: list[object], held: int
) -> None:
    class One:
        def start(self, items: list[str]) -> list[Started]:
            return [started]

        def step(self, states: list[object]) -> tuple[list[str], list[bool]]:
            raise AssertionError("nothing is stepped in the job that started it")

    executor = StepExecutor(One())
    done = executor.advance(StepJob((7,), ("x",)))
    got = [type(c).__name__ if isinstance(c, BaseException) else c for c in done.chunks]
    assert (done.keys, got, done.finished) == ([7], chunks, [held == 0])
    assert executor.active == held


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_streams_from_a_model_that_starts_with_the_first_chunk(mode: str) -> None:
    Prefilled.calls.clear()
    stage = Stage(Prefilled, mode=mode, max_batch_size=4)  # type: ignore[arg-type]
    async with Service(stage) as service:
        first = service.stream("a:3")
        assert await first.__anext__() == "a-0"
        answers = await asyncio.gather(
            service.submit("b:1"),
            service.submit("c:4"),
            service.submit("bad:2:fail@0"),
            return_exceptions=True,
        )
        rest = [chunk async for chunk in first]
    assert rest == ["a-1", "a-2"]
    assert answers[:2] == [["b-0"], ["c-0", "c-1", "c-2", "c-3"]]
    assert isinstance(answers[2], ItemError) and "bad failed in start" in str(answers[2])
    if mode == "thread":  # the calls are seen here: no step before the first chunk
        assert Prefilled.calls[0] == ("start", ["a"])
        assert all("b" not in names for kind, names in Prefilled.calls if kind == "step")
