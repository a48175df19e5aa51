"""Out-of-memory errors: recognising them, and the batch-cost ceiling learned from them.

A batch that runs out of memory is split in halves and each half run again (see
:func:`microbatch.execution.execution_plan`); an item that runs out of memory alone
gets that error as its own. The spans that ran out are reported back to the batcher,
whose :class:`CostCeiling` then keeps batches below the cost that failed, and probes
back up slowly while batches near the ceiling succeed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CostCeiling", "MemorySplits", "is_out_of_memory"]


def is_out_of_memory(error: BaseException, extra: Sequence[type[BaseException]] = ()) -> bool:
    """Whether ``error`` means the model ran out of memory: a :class:`MemoryError`,
    PyTorch's ``OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``, matched by name
    so that torch is not imported here), or one of the ``extra`` types."""
    if isinstance(error, MemoryError):
        return True
    kind = type(error)
    if kind.__name__ == "OutOfMemoryError" and kind.__module__.split(".")[0] == "torch":
        return True
    return bool(extra) and isinstance(error, tuple(extra))


@dataclass
class MemorySplits:
    """What one batch's execution learns about memory: which calls of the model ran
    out of memory (``failed``: the positions of each one's items in the batch).

    Args:
        extra: Exception types that also mean "out of memory".
    """

    extra: tuple[type[BaseException], ...] = ()
    failed: list[tuple[int, ...]] = field(default_factory=list)
    running: Sequence[int] = ()
    """The positions of the items of the call being made (set by the runner)."""

    def matches(self, error: BaseException) -> bool:
        """Whether ``error`` is an out-of-memory error."""
        return is_out_of_memory(error, self.extra)


class CostCeiling:
    """The largest batch cost believed to fit in memory, learned from failures.

    A batch of cost ``c`` that ran out of memory (more than one item) lowers the
    ceiling to ``backoff * c``. Every ``probe_after`` batches in a row that succeed
    at ``near`` of the ceiling or more raise it by ``probe_step``, so a ceiling
    learned under a transient shortage comes back up slowly. None: no ceiling yet.

    Not thread-safe: the batcher calls it from its loop or under its lock.
    """

    def __init__(
        self,
        *,
        backoff: float = 0.9,
        probe_after: int = 32,
        probe_step: float = 1.05,
        near: float = 0.75,
    ) -> None:
        self.backoff = backoff
        self.probe_after = probe_after
        self.probe_step = probe_step
        self.near = near
        self.value: float | None = None
        self.failures = 0
        self._successes = 0

    def ran_out(self, cost: float) -> None:
        """A batch (or a part of one) of ``cost`` ran out of memory."""
        self.failures += 1
        self._successes = 0
        lowered = self.backoff * cost
        self.value = lowered if self.value is None else min(self.value, lowered)

    def succeeded(self, cost: float) -> None:
        """A whole batch of ``cost`` ran without running out of memory."""
        value = self.value
        if value is None or cost < self.near * value:
            return
        self._successes += 1
        if self._successes >= self.probe_after:
            self._successes = 0
            self.value = value * self.probe_step
