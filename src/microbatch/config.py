"""Batching settings: one frozen, validated value shared by every batcher."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .composition import BatchCostMode, Composer
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
        cost_fn: Cost of one item (tokens, pixels, samples): a number >= 0; with
            ``rows``, of one row. Batches are then kept within ``max_batch_cost``.
        max_batch_cost: Most cost per batch, counted as ``batch_cost`` says. An
            item that costs more alone is refused (:class:`~microbatch.errors.
            ItemTooLarge`, HTTP 422), or, with ``rows``, split into parts that fit.
        batch_cost: ``"padded"`` (default): a batch costs its largest per-row cost
            times its rows, as a model that pads to the longest input pays;
            ``"sum"``: the sum of its items' costs (ragged models).
        group_by_cost: Form each batch from items of similar cost among the oldest
            ``group_window`` queued, around the item that waited longest for its
            cost, instead of the oldest items in order (see
            :mod:`microbatch.composition`).
        group_window: How many of the oldest queued items grouping chooses from.
        max_wait_ms: The age bound of grouping: once the oldest item has waited
            this long, batches are formed around the oldest item (default:
            10 x ``max_latency_ms``, at least 1 s).
        split_on_oom: When a batch runs out of memory (``MemoryError``,
            ``torch.cuda.OutOfMemoryError`` or one of ``oom_errors``), split it
            and run the halves again, and learn a batch-cost ceiling from it.
        oom_errors: More exception types that mean "out of memory".

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
    cost_fn: Callable[[Any], float] | None = None
    max_batch_cost: float | None = None
    batch_cost: BatchCostMode = "padded"
    group_by_cost: bool = False
    group_window: int = 256
    max_wait_ms: float | None = None
    split_on_oom: bool = True
    oom_errors: tuple[type[BaseException], ...] = ()

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
        self._check_composition()

    def _check_composition(self) -> None:
        if self.cost_fn is not None and not callable(self.cost_fn):
            raise ValueError(f"cost_fn must be callable, got {self.cost_fn!r}")
        budget = self.max_batch_cost
        if budget is not None and (not _is_real(budget) or not (0 < budget < math.inf)):
            raise ValueError(f"max_batch_cost must be None or a number > 0, got {budget!r}")
        if budget is not None and self.cost_fn is None:
            raise ValueError("max_batch_cost needs cost_fn: the cost of one item")
        if self.batch_cost not in ("padded", "sum"):
            raise ValueError(f"batch_cost must be 'padded' or 'sum', got {self.batch_cost!r}")
        _require_int("group_window", self.group_window, minimum=1)
        wait = self.max_wait_ms
        if wait is not None and (not _is_real(wait) or not (0 <= wait < math.inf)):
            raise ValueError(f"max_wait_ms must be None or a finite number >= 0, got {wait!r}")
        errors = self.oom_errors
        if not isinstance(errors, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in errors
        ):
            raise ValueError(f"oom_errors must be a tuple of exception types, got {errors!r}")

    @property
    def max_latency_s(self) -> float:
        """``max_latency_ms`` in seconds."""
        return self.max_latency_ms / 1000.0

    @property
    def cost_mode(self) -> BatchCostMode:
        """How batch cost is counted: ``batch_cost`` with a ``cost_fn``; without
        one an item costs its batch units, summed."""
        return "sum" if self.cost_fn is None else self.batch_cost

    def new_composer(self) -> Composer:
        """A fresh composer for one batcher (it keeps a learned ceiling)."""
        wait_ms = self.max_wait_ms
        if wait_ms is None:
            wait_ms = max(10 * self.max_latency_ms, 1000.0)
        return Composer(
            self.max_batch_size,
            self.max_batch_cost,
            self.cost_mode,
            group=self.group_by_cost,
            window=self.group_window,
            max_wait_s=wait_ms / 1000.0,
            measured=self.cost_fn is not None,
        )

    def new_policy(self) -> Policy:
        """A fresh policy for one batcher: made by name or by the factory, or a deep
        copy of the prototype Policy object (its settings and a state of its own).

        Raises:
            TypeError: The factory returned something that is not a Policy.
        """
        spec = self.policy
        if spec == "fixed":
            return FixedPolicy(
                self.max_batch_size, self.max_latency_s, max_batch_cost=self.max_batch_cost
            )
        if spec == "adaptive":
            return AdaptivePolicy(
                self.max_batch_size,
                self.max_latency_s,
                slots=self.max_concurrent_batches,
                max_batch_cost=self.max_batch_cost,
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
