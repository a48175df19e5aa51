"""Batching settings: one frozen, validated value shared by every batcher."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .merge import RowFormat
    from .policy import Policy

__all__ = ["BatchConfig"]


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """How items are gathered into batches.

    Args:
        max_batch_size: Largest batch, counted in items, or in the units of
            ``size_fn`` / rows when one is given.
        max_latency_ms: The latency bound a batch is formed under. The fixed policy
            waits at most this long after a batch's first item; the adaptive policy
            releases early enough that the oldest item is answered within it.
        policy: ``"adaptive"`` (default), ``"fixed"``, or an object implementing
            :class:`microbatch.policy.Policy`.
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
    policy: Literal["adaptive", "fixed"] | Policy = "adaptive"
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
        if isinstance(self.policy, str) and self.policy not in ("adaptive", "fixed"):
            raise ValueError(
                f"policy must be 'adaptive', 'fixed' or a Policy object, got {self.policy!r}"
            )
        if isinstance(self.rows, str) and self.rows not in ("list", "numpy"):
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


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
