"""Models and batched functions the HTTP tests serve (importable: workers are spawned)."""

from __future__ import annotations

import asyncio
import time

import msgspec
import numpy as np
import numpy.typing as npt

import microbatch
from microbatch import BatchConfig, Model, Service, Stage, WorkerContext


class Point(msgspec.Struct):
    """A request item with a named field, so a validation error has a path."""

    x: float


class Doubled(msgspec.Struct):
    y: float


class Double(Model):
    """``{"x": x}`` -> ``{"y": 2x}``; x == 13 fails in the model, for that item only."""

    def predict(self, batch: list[Point]) -> list[Doubled]:
        time.sleep(0.002)
        if any(point.x == 13 for point in batch):
            raise ValueError("secret internal detail: /opt/weights/13.bin")
        return [Doubled(2 * point.x) for point in batch]


service = Service(
    Stage(Double, workers=1, batching=BatchConfig(max_batch_size=32, max_latency_ms=5)),
    examples=[Point(1.0)],
)


@microbatch.batch(max_batch_size=32, max_latency_ms=2)
async def double(points: list[Point]) -> list[Doubled]:
    """The in-process flavour of :class:`Double`; x == 13 raises, x == 7 sleeps 0.5 s."""
    if any(point.x == 7 for point in points):
        await asyncio.sleep(0.5)
    if any(point.x == 13 for point in points):
        raise ValueError("secret internal detail: /opt/weights/13.bin")
    return [Doubled(2 * point.x) for point in points]


@microbatch.batch(max_batch_size=8, max_latency_ms=1)
def scale(rows: list[npt.NDArray[np.float32]]) -> list[npt.NDArray[np.float32]]:
    """A sync function over numpy arrays (runs in a thread)."""
    return [row * 2 for row in rows]


@microbatch.batch(max_batch_size=8)
async def untyped(items):  # type: ignore[no-untyped-def]
    return [{"echo": item} for item in items]


@microbatch.batch(max_batch_size=8)
async def unencodable(items: list[int]) -> list[object]:
    return [object() for _ in items]


class SlowDouble(Model):
    """:class:`Double` at 0.3 s per batch of at most 8: requests stay in flight a while."""

    def predict(self, batch: list[Point]) -> list[Doubled]:
        time.sleep(0.3)
        return [Doubled(2 * point.x) for point in batch]


slow_service = Service(
    Stage(SlowDouble, workers=1, batching=BatchConfig(max_batch_size=8, max_latency_ms=5))
)

GATE: asyncio.Event | None = None
"""Set by a test (in its own event loop); :func:`gated` holds every batch until it is set."""
SEEN: list[int] = []
"""Every item :func:`gated` has computed."""


@microbatch.batch(max_batch_size=1, max_latency_ms=0, max_queue=1)
async def gated(items: list[int]) -> list[int]:
    """One item per batch, one batch at a time, one item queued: held until GATE is set."""
    assert GATE is not None
    await GATE.wait()
    SEEN.extend(items)
    return [item + 1 for item in items]


@microbatch.batch(max_batch_size=32, max_latency_ms=1)
async def halve(points: list[Point]) -> list[Doubled]:
    """A model that never fails (for schema fuzzing): ``{"x": x}`` -> ``{"y": x / 2}``."""
    return [Doubled(point.x / 2) for point in points]


class NoWeights(Model):
    def setup(self, worker: WorkerContext) -> None:
        raise FileNotFoundError("no weights at /nowhere")

    def predict(self, batch: list[int]) -> list[int]:
        return batch


broken_service = Service(Stage(NoWeights, setup_attempts=1))


class Described(msgspec.Struct):
    text: str


class Describe(Model):
    """``{"y": y}`` -> ``{"text": "y=..."}``: the second stage of :data:`two_stages`."""

    def predict(self, batch: list[Doubled]) -> list[Described]:
        return [Described(f"y={item.y:g}") for item in batch]


def make_two_stages() -> Service:
    """Two stages of distinct names: ``/predict`` runs both, ``/predict/Double`` and
    ``/predict/Describe`` each alone (a new Service each time: one runs once)."""
    return Service(
        Stage(Double, mode="thread", batching=BatchConfig(max_batch_size=16, max_latency_ms=2)),
        Stage(Describe, mode="thread"),
    )


two_stages = make_two_stages()
