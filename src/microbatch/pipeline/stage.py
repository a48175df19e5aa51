"""A stage: a model class, how many workers run it, and how its batches are formed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import BatchConfig
from .model import Model

__all__ = ["Stage"]


@dataclass(frozen=True)
class Stage:
    """One step of a :class:`~microbatch.pipeline.service.Service`.

    Args:
        model: The :class:`Model` subclass (importable: workers are spawned).
        workers: Worker processes running the model.
        batching: How this stage's batches are formed (``max_concurrent_batches``
            is set to ``workers``: one batch per worker).
        name: Shown in errors and stats (default: the model's class name).
        args: Positional arguments for the model's constructor.
        kwargs: Keyword arguments for the model's constructor.
        idempotent: A batch whose worker died is run once more on another worker.
        setup_attempts: Times a worker may die while setting up before the stage fails.
        env: Environment variables set in each worker (e.g. ``CUDA_VISIBLE_DEVICES``).
    """

    model: type[Model]
    workers: int = 1
    batching: BatchConfig = field(default_factory=BatchConfig)
    name: str = ""
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    idempotent: bool = False
    setup_attempts: int = 3
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.model, type) and issubclass(self.model, Model)):
            raise TypeError(f"model must be a Model subclass, got {self.model!r}")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {self.workers!r}")
        if self.setup_attempts < 1:
            raise ValueError(f"setup_attempts must be >= 1, got {self.setup_attempts!r}")
        if not self.name:
            object.__setattr__(self, "name", self.model.__name__)

    @property
    def config(self) -> BatchConfig:
        """The batching settings, with one batch in flight per worker."""
        return replace(self.batching, max_concurrent_batches=self.workers)
