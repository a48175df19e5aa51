"""When a batch is released: the fixed and the adaptive policy.

A batcher asks its policy "at what time should the queued items go?" whenever a
slot is free and something changed (an arrival, a finished batch, a timer). A time at
or before ``now`` means "release now"; a later time means "wait, and ask me again
then or at the next arrival". Policies never sleep and never read a clock: the
batcher passes ``now``, which keeps every decision a pure, testable function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .config import BatchConfig

__all__ = [
    "AdaptivePolicy",
    "CostModel",
    "FixedPolicy",
    "Policy",
    "QueueState",
    "make_policy",
]

_GAP_SMOOTHING = 0.2  # weight of the newest inter-arrival gap in its running mean


@dataclass(slots=True)
class QueueState:
    """What a policy may know about a batcher's queue. The batcher keeps it current.

    Attributes:
        size: Queued batch units (items, or rows/tokens with ``size_fn``/rows).
        count: Queued items.
        in_flight: Items in released batches that have not finished.
        oldest_arrival_s: Arrival time of the oldest queued item.
        newest_arrival_s: Arrival time of the newest item.
        arrival_gap_s: Smoothed time between arrivals (``None`` before the second).
        arrivals: Items that ever arrived.
    """

    size: int = 0
    count: int = 0
    in_flight: int = 0
    oldest_arrival_s: float = 0.0
    newest_arrival_s: float = 0.0
    arrival_gap_s: float | None = None
    arrivals: int = 0

    def arrived(self, now: float, size: int) -> None:
        """Count one new queued item of ``size`` units that arrived at ``now``."""
        if self.arrivals:
            gap = now - self.newest_arrival_s
            previous = self.arrival_gap_s
            self.arrival_gap_s = (
                gap if previous is None else previous + _GAP_SMOOTHING * (gap - previous)
            )
        if not self.count:
            self.oldest_arrival_s = now
        self.newest_arrival_s = now
        self.arrivals += 1
        self.count += 1
        self.size += size

    def left(self, size: int) -> None:
        """Forget one queued item that will not run (cancelled or expired)."""
        self.count -= 1
        self.size -= size


@runtime_checkable
class Policy(Protocol):
    """Decides when queued items are released as a batch.

    Implementations keep whatever state they like; the batcher calls them from one
    thread (or under a lock) at a time.
    """

    def release_at(self, state: QueueState, now: float) -> float:
        """When to release the queued items: ``<= now`` for now, else a later time."""

    def batch_finished(self, size: int, duration_s: float) -> None:
        """Learn from a batch of ``size`` units that took ``duration_s`` to run."""


class FixedPolicy:
    """Release when the batch is full or its oldest item has waited ``max_latency_s``.

    This is the classic size-or-timeout trigger (TF Serving, Triton, MOSEC, Ray): the
    timer starts at the first item's arrival.
    """

    def __init__(self, max_batch_size: int, max_latency_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.max_latency_s = max_latency_s

    def release_at(self, state: QueueState, now: float) -> float:
        """Now if full, else the oldest arrival plus the latency bound."""
        if state.size >= self.max_batch_size:
            return now
        return state.oldest_arrival_s + self.max_latency_s

    def batch_finished(self, size: int, duration_s: float) -> None:
        """The fixed policy learns nothing."""


class CostModel:
    """Batch run time as ``a + b * size``, fitted online by weighted least squares.

    Older batches weigh less (each new batch multiplies the old weights by
    ``forgetting``), so the fit follows a model whose speed changes. With a single
    batch size seen so far the cost is taken as proportional to size, which
    overestimates large batches: the safe side for a latency bound.
    """

    def __init__(self, forgetting: float = 0.95) -> None:
        self._forgetting = forgetting
        self._w = self._wn = self._wnn = self._wd = self._wnd = 0.0
        self.fixed_s = 0.0
        self.per_unit_s = 0.0

    @property
    def samples(self) -> float:
        """Total weight of the samples seen (0 before the first batch)."""
        return self._w

    def observe(self, size: int, duration_s: float) -> None:
        """Add one measured batch and refit."""
        k = self._forgetting
        n = float(size)
        self._w = self._w * k + 1.0
        self._wn = self._wn * k + n
        self._wnn = self._wnn * k + n * n
        self._wd = self._wd * k + duration_s
        self._wnd = self._wnd * k + n * duration_s
        self._refit()

    def predict(self, size: int) -> float:
        """Predicted seconds to run a batch of ``size`` units (0 before any sample)."""
        return self.fixed_s + self.per_unit_s * size

    def _refit(self) -> None:
        w, wn, wnn, wd, wnd = self._w, self._wn, self._wnn, self._wd, self._wnd
        mean_n = wn / w
        variance = wnn / w - mean_n * mean_n
        if variance <= 1e-9 * max(1.0, mean_n * mean_n):
            self.fixed_s, self.per_unit_s = 0.0, (wd / w) / max(mean_n, 1.0)
            return
        slope = (wnd / w - mean_n * wd / w) / variance
        intercept = wd / w - slope * mean_n
        if slope < 0:
            slope, intercept = 0.0, wd / w
        elif intercept < 0:
            slope, intercept = wnd / wnn, 0.0
        self.fixed_s, self.per_unit_s = intercept, slope


class _PeakWindow:
    """The largest value seen in the last one to two windows of ``window_s``."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._start = float("-inf")
        self._current = 0
        self._previous = 0

    def update(self, value: int, now: float) -> int:
        if now - self._start >= self._window_s:
            fresh = now - self._start < 2 * self._window_s
            self._previous = self._current if fresh else 0
            self._current = 0
            self._start = now
        if value > self._current:
            self._current = value
        return max(self._current, self._previous)


class AdaptivePolicy:
    """Release as soon as waiting longer is not worth it, within a latency bound.

    It learns the batch cost ``a + b * size`` from finished batches, and releases
    the queued items when any of these holds:

    1. the batch is full;
    2. every caller seen recently is queued or already in flight, so no one else is
       coming soon (this is why it never waits at concurrency 1);
    3. waiting would push the oldest item past ``max_latency_s``, given the
       predicted run time of a batch one item larger;
    4. the next arrival is not expected before that latest release time;
    5. arrivals are slow enough that batches of the current size keep up with them
       at ``target_utilization`` of the slots;
    6. the next arrival is overdue (twice the mean gap), so the stream has paused.

    Otherwise it asks to be woken at the earlier of the latency limit (3) and the
    overdue time (6), or at the next arrival.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_latency_s: float,
        *,
        slots: int = 1,
        target_utilization: float = 0.8,
        callers_window_s: float = 1.0,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_latency_s = max_latency_s
        self.slots = slots
        self.target_utilization = target_utilization
        self.cost = CostModel()
        self._callers = _PeakWindow(callers_window_s)

    def release_at(self, state: QueueState, now: float) -> float:
        """The release time by the rules in the class docstring."""
        size = state.size
        if size >= self.max_batch_size or self.max_latency_s <= 0:
            return now
        active = state.count + state.in_flight
        if active >= self._callers.update(active, now):
            return now
        cost = self.cost
        latest = state.oldest_arrival_s + self.max_latency_s - cost.predict(size + 1)
        gap = state.arrival_gap_s
        if latest <= now or gap is None:
            return now
        next_arrival = state.newest_arrival_s + gap
        if next_arrival > latest:
            return now
        # Slot time that arrivals need per second if every batch had this size.
        load = cost.predict(size) / (size * gap) if gap > 0 else float("inf")
        if load <= self.target_utilization * self.slots:
            return now
        return min(latest, state.newest_arrival_s + 2 * gap)

    def batch_finished(self, size: int, duration_s: float) -> None:
        """Feed the cost model."""
        self.cost.observe(size, duration_s)


def make_policy(config: BatchConfig) -> Policy:
    """The policy object named by ``config.policy`` (a fresh one per batcher)."""
    spec = config.policy
    if spec == "fixed":
        return FixedPolicy(config.max_batch_size, config.max_latency_s)
    if spec == "adaptive":
        return AdaptivePolicy(
            config.max_batch_size, config.max_latency_s, slots=config.max_concurrent_batches
        )
    if isinstance(spec, Policy):
        return spec
    raise TypeError(f"not a policy: {spec!r}")
