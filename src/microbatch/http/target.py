"""What the HTTP app serves: a Service, or one ``@microbatch.batch`` function,
behind one small interface (start, close, submit, readiness, stats, declared types).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._hints import item_types
from ..decorator import AsyncBatchedFunction, SyncBatchedFunction
from ..pipeline.service import Service
from ..policy import QueueState
from ..stats import ServiceStats, StageStats, StatsRecorder
from ..types import Route, Servable

__all__ = ["FunctionTarget", "Target", "as_target"]


Target = Servable[Any, Any]
"""What the HTTP app serves: the one contract (see :class:`microbatch.types.Servable`)."""


class FunctionTarget:
    """A ``@microbatch.batch`` function run in the server's event loop (a plain
    function runs its batches in a thread, via ``acall``)."""

    def __init__(self, function: AsyncBatchedFunction[Any, Any] | SyncBatchedFunction[Any, Any]):
        self.function = function
        wrapped = getattr(function, "__wrapped__", function)
        self.name = getattr(wrapped, "__name__", "model")
        self.input_type, self.output_type = item_types(wrapped)
        self.routes: dict[str, Route] = {}
        self.examples: tuple[Any, ...] = tuple(getattr(function, "examples", ()))
        self._submit: Callable[..., Any] = (
            function if isinstance(function, AsyncBatchedFunction) else function.acall
        )
        self._started = False
        self._closing = False

    @property
    def ready(self) -> bool:
        """Started and not closing."""
        return self._started and not self._closing

    async def start(self) -> None:
        """Nothing to start: the batcher is made on the first item."""
        self._started = True

    async def close(self) -> None:
        """Close the event loop's batcher, running what is queued."""
        self._closing = True
        if isinstance(self.function, AsyncBatchedFunction):
            await self.function.close()
        else:
            await self.function.aclose()

    async def submit(
        self, item: Any, *, deadline: float | None = None, route: str | None = None
    ) -> Any:
        """Submit one item to the event loop's batcher (a function has no routes).

        Raises:
            KeyError: ``route`` is given.
        """
        if route is not None:
            raise KeyError(f"no route {route!r}")
        return await self._submit(item, deadline=deadline)

    def stats(self) -> ServiceStats:
        """One stage: the function's batcher in this event loop."""
        function = self.function
        if isinstance(function, AsyncBatchedFunction):
            batching = function.stats()
        elif self._started:
            batching = function.loop_batcher.stats()
        else:
            batching = StatsRecorder().snapshot(QueueState())
        slots = function.config.max_concurrent_batches
        stage = StageStats(self.name, slots, slots, 0, batching)
        return ServiceStats(
            self.ready, self._closing, batching.queued + batching.in_flight, (stage,)
        )


def as_target(served: object) -> Servable[Any, Any]:
    """Wrap a :class:`Service` or a ``@microbatch.batch`` function.

    Raises:
        TypeError: ``served`` is neither.
    """
    if isinstance(served, Service):
        return served
    if isinstance(served, (AsyncBatchedFunction, SyncBatchedFunction)):
        return FunctionTarget(served)
    raise TypeError(
        f"expected a microbatch.Service or a @microbatch.batch function, got {served!r}"
    )
