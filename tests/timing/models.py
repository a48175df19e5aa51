"""Models of the timing and tracing tests beyond ``tests/http/models.py``."""

from __future__ import annotations

import microbatch
from tests.http.models import Doubled, Point


@microbatch.batch(max_batch_size=32, max_latency_ms=2)
def triple(points: list[Point]) -> list[Doubled]:
    """A plain (thread-batched) function: its batches run off the event loop."""
    return [Doubled(3 * point.x) for point in points]
