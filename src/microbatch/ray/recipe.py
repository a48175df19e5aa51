"""What travels to each Ray replica: the description of a service, not a running one.

A Service owns worker pools and batchers, and a batched function owns its batchers
and locks; none of that can (or should) be shipped. Each replica builds its own fresh
copy from a recipe: the stages and settings of a Service, or the plain function and
:class:`~microbatch.config.BatchConfig` of a ``@microbatch.batch`` function. Ray
sends the recipe with cloudpickle, so classes and functions defined at module level
travel by reference and must be importable on every node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..config import BatchConfig
from ..decorator import AsyncBatchedFunction, SyncBatchedFunction
from ..execution import is_async_callable
from ..http.openai_routes import openai_declarations
from ..pipeline.service import Service
from ..pipeline.stage import Stage
from .settings import StageMode

__all__ = ["FunctionRecipe", "Recipe", "ServiceRecipe", "recipe_for"]

logger = logging.getLogger("microbatch.ray")


@dataclass(frozen=True)
class ServiceRecipe:
    """A :class:`~microbatch.Service` to build again: its stages and settings."""

    stages: tuple[Stage, ...]
    examples: tuple[Any, ...]
    max_in_flight: int
    grace_s: float
    service_name: str = ""
    declarations: tuple[tuple[str, Any], ...] = ()
    """Attributes set on the service that declare its OpenAI routes
    (``embedding_model``, ``completion_model``), set again on each copy."""

    @property
    def name(self) -> str:
        """The service's name (by default its last stage's: what it answers with)."""
        return self.service_name or self.stages[-1].name

    @property
    def bound(self) -> int:
        """Most items one replica takes at once before it answers ``Overloaded``."""
        return self.max_in_flight

    @property
    def items_per_replica(self) -> int:
        """Items a fully used replica holds: the largest stage's batch slots x size."""
        return max(stage.workers * stage.config.max_batch_size for stage in self.stages)

    def build(self, stage_mode: StageMode) -> Service[Any, Any]:
        """A fresh Service, its stages in threads (``"thread"``) or as defined."""
        stages = self.stages
        if stage_mode == "thread":
            stages = tuple(_in_threads(stage) for stage in stages)
        service: Service[Any, Any] = Service(
            *stages,
            examples=self.examples,
            max_in_flight=self.max_in_flight,
            grace_s=self.grace_s,
            name=self.service_name,
        )
        for attribute, value in self.declarations:
            setattr(service, attribute, value)
        return service


@dataclass(frozen=True)
class FunctionRecipe:
    """A ``@microbatch.batch`` function to build again: the function and its settings."""

    function: Callable[[list[Any]], Any]
    config: BatchConfig
    name: str

    @property
    def bound(self) -> int:
        """Most items one replica takes at once: its queue plus its running batches."""
        config = self.config
        return config.max_queue + config.max_batch_size * config.max_concurrent_batches

    @property
    def items_per_replica(self) -> int:
        """Items a fully used replica holds: batch slots x batch size."""
        return self.config.max_batch_size * self.config.max_concurrent_batches

    def build(
        self, stage_mode: StageMode
    ) -> AsyncBatchedFunction[Any, Any] | SyncBatchedFunction[Any, Any]:
        """A fresh batched function (``stage_mode`` does not apply: it has no stages)."""
        if is_async_callable(self.function):
            return AsyncBatchedFunction(self.function, self.config)
        return SyncBatchedFunction(self.function, self.config)


Recipe = ServiceRecipe | FunctionRecipe
"""What a replica builds its service from."""


def recipe_for(served: object) -> Recipe:
    """The recipe of a :class:`~microbatch.Service` or a ``@microbatch.batch`` function.

    Raises:
        TypeError: ``served`` is neither (a batched method must be bound first: serve
            ``instance.method``).
    """
    if isinstance(served, Service):
        return ServiceRecipe(
            tuple(served.stages),
            tuple(served.examples),
            served.max_in_flight,
            served.grace_s,
            served.name,
            openai_declarations(served),
        )
    if isinstance(served, (AsyncBatchedFunction, SyncBatchedFunction)):
        function = served.__wrapped__
        name = getattr(function, "__name__", "model")
        return FunctionRecipe(function, served.config, name)
    raise TypeError(
        f"expected a microbatch.Service or a @microbatch.batch function, got {served!r}"
    )


def _in_threads(stage: Stage) -> Stage:
    """The stage in threads of the replica; its process-only placement is dropped."""
    if stage.mode == "thread":
        return stage
    if stage.env or stage.cpus is not None:
        logger.warning(
            "stage %r: env and cpus apply to worker processes and are not used with"
            " stage_mode='thread'; give replicas their environment with"
            " ray_actor_options={'runtime_env': {'env_vars': ...}} and GPUs with num_gpus",
            stage.name,
        )
    return replace(stage, mode="thread", env={}, cpus=None)
