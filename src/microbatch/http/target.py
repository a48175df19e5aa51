"""What the HTTP app serves: a Service, or one ``@microbatch.batch`` function,
behind one small interface (start, close, submit, readiness, stats, declared types).
"""

from __future__ import annotations

from typing import Any, Protocol

from .._hints import item_types
from ..decorator import AsyncBatchedFunction, SyncBatchedFunction
from ..pipeline.service import Service
from ..stats import ServiceStats

__all__ = ["FunctionTarget", "ServiceTarget", "Target", "as_target"]


class Target(Protocol):
    """The served model, as the HTTP app sees it."""

    name: str
    input_type: Any
    output_type: Any
    routes: dict[str, tuple[Any, Any]]
    """More entry points than the whole model, by name: their input and output types
    (a Service of several stages: each stage alone). Served at ``/predict/{name}``."""

    @property
    def ready(self) -> bool:
        """Able to take items now."""

    async def start(self) -> None:
        """Start workers and warm up."""

    async def close(self) -> None:
        """Refuse new items, finish queued ones, stop workers."""

    async def submit(self, item: Any, *, deadline: float | None, route: str | None = None) -> Any:
        """One item in (to the whole model, or to one of :attr:`routes`), its own
        result out (or its own error raised)."""

    def stats(self) -> ServiceStats:
        """A snapshot of every stage's counters."""


class ServiceTarget:
    """A :class:`~microbatch.Service`: types from its first and last stages' ``predict``;
    with several stages (of distinct names), each stage alone is a route too."""

    def __init__(self, service: Service) -> None:
        self.service = service
        stages = service.stages
        self.name = stages[-1].name
        self.input_type = item_types(stages[0].model.predict)[0]
        self.output_type = item_types(stages[-1].model.predict)[1]
        names = [stage.name for stage in stages]
        several = len(stages) > 1 and len(set(names)) == len(names)
        self.routes = {s.name: item_types(s.model.predict) for s in stages} if several else {}

    @property
    def ready(self) -> bool:
        """See :attr:`Service.ready`."""
        return self.service.ready

    async def start(self) -> None:
        """See :meth:`Service.start`."""
        await self.service.start()

    async def close(self) -> None:
        """See :meth:`Service.close`."""
        await self.service.close()

    async def submit(self, item: Any, *, deadline: float | None, route: str | None = None) -> Any:
        """See :meth:`Service.submit` (``route``: its ``stage``)."""
        return await self.service.submit(item, deadline=deadline, stage=route)

    def stats(self) -> ServiceStats:
        """See :meth:`Service.stats`."""
        return self.service.stats()


class FunctionTarget:
    """A ``@microbatch.batch`` function run in the server's event loop (a plain
    function runs its batches in a thread, via ``acall``): the function is Servable
    itself, this only gives it the Target shape."""

    def __init__(self, function: AsyncBatchedFunction[Any, Any] | SyncBatchedFunction[Any, Any]):
        self.function = function
        self.name = function.name
        self.input_type, self.output_type = function.input_type, function.output_type
        self.routes: dict[str, tuple[Any, Any]] = {}

    @property
    def ready(self) -> bool:
        """Started and not closing."""
        return self.function.ready

    async def start(self) -> None:
        """Nothing to start: the batcher is made on the first item."""
        await self.function.start()

    async def close(self) -> None:
        """Close the function's batcher, running what is queued."""
        await self.function.close()

    async def submit(self, item: Any, *, deadline: float | None, route: str | None = None) -> Any:
        """Submit one item (a function has no routes).

        Raises:
            KeyError: ``route`` is given.
        """
        return await self.function.submit(item, deadline=deadline, route=route)

    def stats(self) -> ServiceStats:
        """One stage: the function's batcher."""
        return self.function.stats()


def as_target(served: object) -> Target:
    """Wrap a :class:`Service` or a ``@microbatch.batch`` function.

    Raises:
        TypeError: ``served`` is neither.
    """
    if isinstance(served, Service):
        return ServiceTarget(served)
    if isinstance(served, (AsyncBatchedFunction, SyncBatchedFunction)):
        return FunctionTarget(served)
    raise TypeError(
        f"expected a microbatch.Service or a @microbatch.batch function, got {served!r}"
    )
