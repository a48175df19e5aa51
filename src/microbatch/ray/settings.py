"""How many replicas serve a microbatch service on Ray, and what each one gets."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ReplicaSettings", "StageMode"]

StageMode = Literal["thread", "process"]
"""Where a Service's stages run inside a replica: threads of the replica's process,
or the stages' own worker processes."""

_RESERVED_ACTOR_OPTIONS = ("num_cpus", "num_gpus")


@dataclass(frozen=True)
class ReplicaSettings:
    """The Ray Serve side of a microbatch deployment.

    Args:
        num_replicas: Replicas to run (default 1). Leave it ``None`` with
            ``autoscaling``.
        autoscaling: Ray Serve's autoscaling settings (``min_replicas``,
            ``max_replicas``, ``target_ongoing_requests``, ...; see
            ``ray.serve.config.AutoscalingConfig``). Without
            ``target_ongoing_requests``, a replica counts as fully used when it holds
            a full batch for every batch slot (Ray's own default of 2 would add
            replicas long before batches fill).
        num_cpus: CPUs Ray reserves for each replica (fractional allowed).
        num_gpus: GPUs Ray reserves for each replica; fractional values share a GPU
            (0.5: two replicas per GPU). Ray sets ``CUDA_VISIBLE_DEVICES`` for it.
        max_ongoing_requests: Requests Ray sends to one replica at once. Default:
            a little more than the service's own bound (``max_in_flight``, or the
            function's queue plus its batches), so that batches are never capped by
            Ray and an overloaded replica answers microbatch's own ``Overloaded``
            (HTTP 503) at once instead of Ray queueing the request.
        stage_mode: ``"thread"`` (default; measured faster under Ray, see the
            README): a Service's stages run in threads of the replica's process,
            and Ray's replicas are the processes. ``"process"``: each stage keeps
            its worker processes, started inside every replica.
        ray_actor_options: More options for the replica actors (``runtime_env``,
            ``memory``, ``resources``, ``accelerator_type``, ...); CPUs and GPUs are
            set by ``num_cpus`` and ``num_gpus``.
        graceful_shutdown_timeout_s: How long a stopping replica may take to finish
            the requests it holds before Ray kills it. Default: a Service's own grace
            period plus a margin (Ray's default for a batched function).

    Raises:
        ValueError: A setting is out of range, or both ``num_replicas`` and
            ``autoscaling`` are given; the message names the setting and its value.
    """

    num_replicas: int | None = None
    autoscaling: Mapping[str, Any] | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_ongoing_requests: int | None = None
    stage_mode: StageMode = "thread"
    ray_actor_options: Mapping[str, Any] = field(default_factory=dict)
    graceful_shutdown_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.num_replicas is not None and self.autoscaling is not None:
            raise ValueError("give num_replicas or autoscaling, not both")
        if self.num_replicas is not None:
            _require_int("num_replicas", self.num_replicas, minimum=1)
        if self.max_ongoing_requests is not None:
            _require_int("max_ongoing_requests", self.max_ongoing_requests, minimum=1)
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if not _is_real(value) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        grace = self.graceful_shutdown_timeout_s
        if grace is not None and (not _is_real(grace) or not 0 < grace < math.inf):
            raise ValueError(
                f"graceful_shutdown_timeout_s must be a finite number > 0, got {grace!r}"
            )
        if self.stage_mode not in ("thread", "process"):
            raise ValueError(f"stage_mode must be 'thread' or 'process', got {self.stage_mode!r}")
        if self.autoscaling is not None and not isinstance(self.autoscaling, Mapping):
            raise ValueError(f"autoscaling must be a mapping, got {self.autoscaling!r}")
        reserved = [name for name in _RESERVED_ACTOR_OPTIONS if name in self.ray_actor_options]
        if reserved:
            raise ValueError(
                f"set {' and '.join(reserved)} with ReplicaSettings' own fields,"
                " not in ray_actor_options"
            )

    def actor_options(self) -> dict[str, Any]:
        """The replica actors' options: resources plus ``ray_actor_options``."""
        return {**self.ray_actor_options, "num_cpus": self.num_cpus, "num_gpus": self.num_gpus}

    def scaling(self, items_per_replica: int) -> dict[str, Any]:
        """``num_replicas`` or ``autoscaling_config`` for ``serve.deployment``.

        Args:
            items_per_replica: What one fully used replica holds (its batch slots
                times its batch size): the default ``target_ongoing_requests``.
        """
        if self.autoscaling is None:
            return {"num_replicas": self.num_replicas or 1}
        config = {"target_ongoing_requests": items_per_replica, **self.autoscaling}
        return {"autoscaling_config": config}


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
