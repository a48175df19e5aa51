"""A stage: a model class, how many workers run it, where, and how its batches are formed."""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..config import BatchConfig, PolicySpec
from ..merge import RowFormat
from ..streams import MAX_BUFFERED_CHUNKS
from .model import Model
from .worker_env import WorkerEnv

__all__ = ["Stage"]

Env = Mapping[str, str] | Callable[[int], Mapping[str, str]]
Cpus = Sequence[int] | Callable[[int], Sequence[int]] | None


@dataclass(frozen=True)
class Stage:
    """One step of a :class:`~microbatch.pipeline.service.Service`.

    Args:
        model: The :class:`Model` subclass. In process mode it is sent to the
            workers by reference, so it must be importable (module level, not
            defined inside a function), and ``args``/``kwargs`` must pickle.
        workers: Workers running the model, one model instance each.
        mode: ``"process"`` (default): each worker is a spawned process.
            ``"thread"``: each worker is a thread of the serving process, for
            models that release the GIL (most numpy/torch kernels do).
        batching: How this stage's batches are formed, as one
            :class:`~microbatch.config.BatchConfig` (``max_concurrent_batches`` is
            set to ``workers``: one batch per worker).
        max_batch_size, max_latency_ms, policy, max_queue, timeout_s, size_fn, rows,
            isolate_errors, cost_fn, max_batch_cost, batch_cost, group_by_cost,
            group_window, max_wait_ms, split_on_oom, oom_errors: Each
            :class:`~microbatch.config.BatchConfig` setting, as a keyword
            (``Stage(Model, max_queue=16)``), validated as BatchConfig does. A
            keyword given wins over the same setting in ``batching``; None (the
            default) leaves ``batching``'s value.
        max_concurrent_batches: Only ``workers`` (or None): a stage runs one batch
            per worker.
        name: Shown in errors and stats (default: the model's class name).
        args: Positional arguments for the model's constructor.
        kwargs: Keyword arguments for the model's constructor.
        idempotent: A batch whose worker died is run once more on another worker.
        setup_attempts: Times a worker may die while setting up before the stage fails.
        env: Environment variables for each worker process (e.g.
            ``CUDA_VISIBLE_DEVICES``), or a function of the worker index giving them.
        cpus: CPU ids the stage's worker processes are pinned to, or a function of
            the worker index giving each worker its own (Linux only).
        max_buffered_chunks: A streaming stage's most chunks per stream unread by its
            caller; one more ends the stream with :class:`~microbatch.SlowReader`
            (None: no limit).
        min_joiners, max_join_wait_ms: A step model whose ``start`` costs about a
            step whatever it starts (a prompt read before the first token): while
            items are active, queued items wait to join until ``min_joiners`` of
            them wait, they fill every free place, or the oldest has waited
            ``max_join_wait_ms``, so that one start serves several (as vLLM's
            scheduler delay). The defaults (1, 0) start every item at the next step.
    """

    model: type[Model]
    workers: int = 1
    mode: Literal["process", "thread"] = "process"
    batching: BatchConfig = field(default_factory=BatchConfig)
    max_batch_size: int | None = None
    max_latency_ms: float | None = None
    policy: PolicySpec | None = None
    max_queue: int | None = None
    max_concurrent_batches: int | None = None
    timeout_s: float | None = None
    size_fn: Callable[[Any], int] | None = None
    rows: Literal["list", "numpy"] | RowFormat | None = None
    isolate_errors: bool | None = None
    cost_fn: Callable[[Any], float] | None = None
    max_batch_cost: float | None = None
    batch_cost: Literal["padded", "sum"] | None = None
    group_by_cost: bool | None = None
    group_window: int | None = None
    max_wait_ms: float | None = None
    split_on_oom: bool | None = None
    oom_errors: tuple[type[BaseException], ...] | None = None
    name: str = ""
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    idempotent: bool = False
    setup_attempts: int = 3
    env: Env = field(default_factory=dict)
    cpus: Cpus = None
    max_buffered_chunks: int | None = MAX_BUFFERED_CHUNKS
    min_joiners: int = 1
    max_join_wait_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.model, type) and issubclass(self.model, Model)):
            raise TypeError(f"model must be a Model subclass, got {self.model!r}")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {self.workers!r}")
        if self.mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', got {self.mode!r}")
        if self.setup_attempts < 1:
            raise ValueError(f"setup_attempts must be >= 1, got {self.setup_attempts!r}")
        if self.max_buffered_chunks is not None and (
            not isinstance(self.max_buffered_chunks, int) or self.max_buffered_chunks < 1
        ):
            raise ValueError(
                f"max_buffered_chunks must be an int >= 1 or None, got {self.max_buffered_chunks!r}"
            )
        joiners = self.min_joiners
        if isinstance(joiners, bool) or not isinstance(joiners, int) or joiners < 1:
            raise ValueError(f"min_joiners must be an int >= 1, got {self.min_joiners!r}")
        wait = self.max_join_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < math.inf:
            raise ValueError(f"max_join_wait_ms must be a number >= 0, got {wait!r}")
        if not isinstance(self.batching, BatchConfig):
            raise TypeError(f"batching must be a BatchConfig, got {self.batching!r}")
        if self.max_concurrent_batches not in (None, self.workers):
            raise ValueError(
                "max_concurrent_batches of a stage is its workers (one batch per worker):"
                f" got {self.max_concurrent_batches!r} with workers={self.workers!r}"
            )
        given = {name: getattr(self, name) for name in _SETTINGS if getattr(self, name) is not None}
        # replace() validates the settings as BatchConfig does; the keywords win.
        object.__setattr__(self, "batching", replace(self.batching, **given))
        if not self.name:
            object.__setattr__(self, "name", self.model.__name__)
        if self.mode == "process":
            _check_sendable(self)
        elif self.env or self.cpus is not None:
            raise ValueError("env and cpus apply to worker processes, not to mode='thread'")

    @property
    def config(self) -> BatchConfig:
        """The batching settings, with one batch in flight per worker."""
        return replace(self.batching, max_concurrent_batches=self.workers)

    def env_for(self, index: int) -> dict[str, str]:
        """The environment variables of worker ``index``."""
        return dict(self.env(index) if callable(self.env) else self.env)

    def cpus_for(self, index: int) -> list[int] | None:
        """The CPU ids worker ``index`` is pinned to (None: not pinned)."""
        if self.cpus is None:
            return None
        return list(self.cpus(index) if callable(self.cpus) else self.cpus)

    def worker_env(self, index: int) -> WorkerEnv:
        """What worker process ``index`` sets up before it imports the model: its
        ``env``, its ``cpus``, and its math libraries' thread counts
        (:mod:`~microbatch.pipeline.worker_env`)."""
        return WorkerEnv.of(self.env_for(index), self.cpus_for(index), self.workers)


_SETTINGS = (
    "max_batch_size",
    "max_latency_ms",
    "policy",
    "max_queue",
    "timeout_s",
    "size_fn",
    "rows",
    "isolate_errors",
    "cost_fn",
    "max_batch_cost",
    "batch_cost",
    "group_by_cost",
    "group_window",
    "max_wait_ms",
    "split_on_oom",
    "oom_errors",
)
"""The BatchConfig settings a Stage takes as keywords (max_concurrent_batches is
its workers)."""


def _check_sendable(stage: Stage) -> None:
    """Fail now, clearly, if a spawned worker could not receive the model."""
    model = stage.model
    if "<locals>" in model.__qualname__:
        raise TypeError(
            f"{model.__qualname__} is defined inside a function; worker processes are"
            " spawned and import the model by name: define it at module level"
            " (or use mode='thread')"
        )
    try:
        pickle.dumps((model, stage.args, dict(stage.kwargs)))
    except Exception as exc:
        raise TypeError(
            f"stage {stage.name!r}: the model class and its args/kwargs must pickle to reach"
            f" spawned workers ({type(exc).__name__}: {exc}); use mode='thread' otherwise"
        ) from exc
