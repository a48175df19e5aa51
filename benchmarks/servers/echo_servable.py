"""A servable that answers at once (``{"x"} -> {"y": 2x}``, no batching, no worker):
``microbatch serve echo_servable:servable`` measures the HTTP front alone (issue 15's
probe, ``benchmarks/front_probe.py``)."""

from __future__ import annotations

from typing import Any

import msgspec

from microbatch.stats import ServiceStats


class Point(msgspec.Struct):
    x: float


class Doubled(msgspec.Struct):
    y: float


class Echo:
    """The contract (:class:`microbatch.Servable`) with nothing behind it."""

    name = "echo"
    input_type = Point
    output_type = Doubled
    examples = ()
    ready = True

    def __init__(self) -> None:
        self.routes: dict[str, Any] = {}

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def submit(
        self, item: Point, *, deadline: float | None = None, route: str | None = None
    ) -> Doubled:
        return Doubled(2 * item.x)

    def stats(self) -> ServiceStats:
        return ServiceStats(True, False, 0, ())


servable = Echo()
