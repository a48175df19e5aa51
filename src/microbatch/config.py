"""Batching settings: one frozen, validated value shared by every batcher."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .merge import ListRows, NumpyRows, RowFormat
from .policy import AdaptivePolicy, FixedPolicy, Policy

__all__ = ["BatchConfig", "PolicySpec"]

PolicySpec = Literal["adaptive", "fixed"] | Policy | Callable[[], Policy]
"""A policy name, a prototype Policy object, or a zero-argument factory of policies."""


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """How items are gathered into batches.

    Args:
        max_batch_size: Largest batch, counted in items, or in the units of
            ``size_fn`` / rows when one is given.
        max_latency_ms: The latency bound a batch is formed under. The fixed policy
            waits at most this long after a batch's first item; the adaptive policy
            releases early enough that the oldest item is answered within it.
        policy: ``"adaptive"`` (default), ``"fixed"``, a zero-argument factory
            returning a :class:`microbatch.policy.Policy`, or a Policy object used as a
            *prototype*: policies keep learned state, so every batcher gets its own
            fresh one (:meth:`new_policy`), never the object itself.
        max_queue: Most items waiting for a batch; one more is refused with
            :class:`~microbatch.errors.Overloaded`.
        max_concurrent_batches: Most batches running at once. A batch is released
            only into a free slot, so batches grow while all slots are busy.
        timeout_s: Default per-call timeout; ``None`` means no deadline.
        size_fn: Size of one item in batch units (rows, tokens). Default: 1 each.
        rows: Items are sequences of rows (``"list"``, ``"numpy"`` or a
            :class:`~microbatch.merge.RowFormat`): the function gets the rows of
            many callers merged, each caller gets the results of its own rows, and
            an item with more than ``max_batch_size`` rows is split across batches.
        isolate_errors: When a whole batch raises, split it in halves until the
            failing items are found, so that only they fail.

    Raises:
        ValueError: A setting is out of range; the message names it and its value.
    """

    max_batch_size: int = 64
    max_latency_ms: float = 10.0
    policy: PolicySpec = "adaptive"
    max_queue: int = 4096
    max_concurrent_batches: int = 1
    timeout_s: float | None = None
    size_fn: Callable[[Any], int] | None = None
    rows: Literal["list", "numpy"] | RowFormat | None = None
    isolate_errors: bool = True

    def __post_init__(self) -> None:
        _require_int("max_batch_size", self.max_batch_size, minimum=1)
        _require_int("max_queue", self.max_queue, minimum=1)
        _require_int("max_concurrent_batches", self.max_concurrent_batches, minimum=1)
        if not _is_real(self.max_latency_ms) or not (0 <= self.max_latency_ms < math.inf):
            raise ValueError(
                f"max_latency_ms must be a finite number >= 0, got {self.max_latency_ms!r}"
            )
        if self.timeout_s is not None and (
            not _is_real(self.timeout_s) or not (0 < self.timeout_s < math.inf)
        ):
            raise ValueError(f"timeout_s must be None or a number > 0, got {self.timeout_s!r}")
        policy = self.policy
        if (isinstance(policy, str) and policy not in ("adaptive", "fixed")) or not (
            isinstance(policy, str) or _is_policy(policy) or callable(policy)
        ):
            raise ValueError(
                "policy must be 'adaptive', 'fixed', a Policy object or a factory of"
                f" policies, got {policy!r}"
            )
        if (isinstance(self.rows, str) and self.rows not in ("list", "numpy")) or not (
            self.rows is None or isinstance(self.rows, (str, RowFormat))
        ):
            raise ValueError(f"rows must be 'list', 'numpy' or a RowFormat, got {self.rows!r}")
        if self.rows is not None and self.size_fn is not None:
            raise ValueError(
                "give either rows or size_fn: with rows, an item's size is its row count"
            )
        if self.size_fn is not None and not callable(self.size_fn):
            raise ValueError(f"size_fn must be callable, got {self.size_fn!r}")

    @property
    def max_latency_s(self) -> float:
        """``max_latency_ms`` in seconds."""
        return self.max_latency_ms / 1000.0

    def new_policy(self) -> Policy:
        """A fresh policy for one batcher: made by name or by the factory, or a deep
        copy of the prototype Policy object (its settings and a state of its own).

        Raises:
            TypeError: The factory returned something that is not a Policy.
        """
        spec = self.policy
        if spec == "fixed":
            return FixedPolicy(self.max_batch_size, self.max_latency_s)
        if spec == "adaptive":
            return AdaptivePolicy(
                self.max_batch_size, self.max_latency_s, slots=self.max_concurrent_batches
            )
        if isinstance(spec, str):
            raise ValueError(f"unknown policy {spec!r}")
        if _is_policy(spec):
            return copy.deepcopy(spec)  # type: ignore[return-value]
        made: object = spec()  # type: ignore[operator]
        if not isinstance(made, Policy) or isinstance(made, type):
            raise TypeError(f"the policy factory {spec!r} returned {made!r}, not a Policy")
        return made

    def row_format(self) -> RowFormat | None:
        """The RowFormat that ``rows`` names, or None for one-row items."""
        rows = self.rows
        if rows is None:
            return None
        if rows == "list":
            return ListRows()
        if rows == "numpy":
            return NumpyRows()
        return rows


def _is_policy(value: object) -> bool:
    """A Policy object (a class with the methods is a factory, not a prototype)."""
    return isinstance(value, Policy) and not isinstance(value, type)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
