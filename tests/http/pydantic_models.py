"""A batched function whose item types are pydantic models (for test_pydantic)."""

from __future__ import annotations

from pydantic import BaseModel, Field

import microbatch


class Point(BaseModel):
    """One input: a coordinate pair with a non-negative weight."""

    x: float
    y: float
    weight: float = Field(default=1.0, ge=0)


class Scaled(BaseModel):
    """One result."""

    x: float
    y: float


@microbatch.batch(max_batch_size=16, max_latency_ms=1)
async def scale(points: list[Point]) -> list[Scaled]:
    """Scale each point by its weight."""
    return [Scaled(x=p.x * p.weight, y=p.y * p.weight) for p in points]
