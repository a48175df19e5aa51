"""The small service ``microbatch bench`` is tested against (importable: workers are spawned).

Two process stages, so the report has a mean batch size per stage:
``{"x": x}`` -> (``scale``: ``2x``) -> (``shift``: ``2x + 1``) -> ``{"y": 2x + 1}``.
"""

from __future__ import annotations

import time

import msgspec

from microbatch import BatchConfig, Model, Service, Stage


class Point(msgspec.Struct):
    """A request."""

    x: float


class Answer(msgspec.Struct):
    """A reply."""

    y: float


class Scale(Model):
    """``2x``, at 2 ms per batch (so batches form under load)."""

    def predict(self, batch: list[Point]) -> list[float]:
        time.sleep(0.002)
        return [2 * point.x for point in batch]


class Shift(Model):
    """``+ 1``."""

    def predict(self, batch: list[float]) -> list[Answer]:
        return [Answer(value + 1) for value in batch]


service = Service(
    Stage(Scale, batching=BatchConfig(max_batch_size=16, max_latency_ms=5)),
    Stage(Shift, batching=BatchConfig(max_batch_size=16, max_latency_ms=5)),
    examples=[Point(1.0)],
)
