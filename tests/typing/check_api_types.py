"""Checked by mypy in CI (not run): the decorator turns ``list[T] -> list[R]`` into ``T -> R``."""

from __future__ import annotations

from dataclasses import dataclass

from typing_extensions import assert_type

import microbatch
from microbatch import ServiceStats
from microbatch.types import Servable


@dataclass
class Row:
    value: float


@microbatch.batch(max_batch_size=64, max_latency_ms=10)
async def embed(texts: list[str]) -> list[list[float]]:
    return [[float(len(t))] for t in texts]


@microbatch.batch(max_batch_size=64, max_latency_ms=10)
def score(rows: list[Row]) -> list[float]:
    return [r.value for r in rows]


@microbatch.batch
def bare(xs: list[int]) -> list[str]:
    return [str(x) for x in xs]


async def uses() -> None:
    assert_type(await embed("one text"), list[float])
    assert_type(score(Row(1.0)), float)
    assert_type(await score.acall(Row(2.0)), float)
    assert_type(bare(3), str)
    await embed(3)  # type: ignore[arg-type]
    score("not a row")  # type: ignore[arg-type]


class Model:
    def __init__(self, scale: float) -> None:
        self.scale = scale

    @microbatch.batch(max_batch_size=8)
    async def predict(self, xs: list[float]) -> list[float]:
        return [x * self.scale for x in xs]

    @microbatch.batch(max_batch_size=8)
    def score(self, rows: list[Row]) -> list[str]:
        return [str(r.value * self.scale) for r in rows]


async def uses_methods(model: Model) -> None:
    assert_type(await model.predict(1.0), float)
    assert_type(model.score(Row(2.0)), str)
    await model.predict("x")  # type: ignore[arg-type]


async def uses_servable() -> None:
    served: Servable[str, list[float]] = embed  # a batched function is Servable
    also: Servable[Row, float] = score
    assert_type(await embed.submit("text", deadline=None), list[float])
    assert_type(await score.submit(Row(1.0)), float)
    await embed.submit(123)  # type: ignore[arg-type]
    await served.submit(123)  # type: ignore[arg-type]
    await also.submit("not a row")  # type: ignore[arg-type]
    assert_type(embed.stats(), ServiceStats)
    assert_type(score.stats(), ServiceStats)
    await score.close()
    await embed.close()


class Tokens(microbatch.Model):
    def predict(self, batch: list[str]) -> list[list[int]]:
        return [[len(text)] for text in batch]


async def uses_a_typed_service() -> None:
    service: microbatch.Service[str, list[int]] = microbatch.Service(microbatch.Stage(Tokens))
    served: Servable[str, list[int]] = service  # a Service is Servable too
    assert_type(await service.submit("text", timeout_s=1.0), list[int])
    assert_type(await served.submit("text", route=None), list[int])
    await service.submit(123)  # type: ignore[arg-type]
    await served.submit(b"bytes")  # type: ignore[arg-type]
    assert_type(service.stats(), ServiceStats)
