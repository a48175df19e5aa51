"""microbatch streams of the simulated step model: ``stepwise`` (a StepModel, items
join and leave between steps) and ``lockstep`` (a generator predict: a batch runs
until its longest item ends). ``microbatch serve stream_microbatch:stepwise``;
``POST /stream`` with the number of chunks as the body; ``stepwise`` is also the
OpenAI text generator ``steps`` (``/v1/completions``, ``max_tokens`` chunks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stream_models import CHUNK, MAX_ACTIVE, simulate_step

from microbatch import END, Model, Service, Stage, StepModel
from microbatch.http import CompletionModel


class Steps(StepModel):
    """Item ``n``: ``n`` chunks."""

    def start(self, items: list[int]) -> list[list[int]]:
        return [[n, 0] for n in items]

    def step(self, states: list[list[int]]) -> tuple[list[str], list[bool]]:
        simulate_step(len(states))
        for state in states:
            state[1] += 1
        return [CHUNK] * len(states), [position >= n for n, position in states]


class Lockstep(Model):
    """The same model as a generator predict: every step costs the whole batch."""

    def predict(self, batch: list[int]) -> Iterator[list[Any]]:
        for position in range(1, max(batch) + 1):
            simulate_step(len(batch))
            yield [CHUNK if position <= n else END for n in batch]


def _service(model: type[Model]) -> Service[int, list[str]]:
    stage = Stage(model, mode="thread", max_batch_size=MAX_ACTIVE, max_queue=10_000)
    return Service(stage, examples=[2])


def _chunks_asked(asked: Any) -> int:
    """An OpenAI completion's item: as many chunks as its ``max_tokens``."""
    return int(asked.max_tokens or 16)


stepwise = _service(Steps)
stepwise.completion_model = CompletionModel(name="steps", item=_chunks_asked)  # type: ignore[attr-defined]
lockstep = _service(Lockstep)
