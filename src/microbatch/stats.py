"""Counters a batcher keeps, and the frozen snapshot it hands out."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from ._stream_stats import (
    CHUNKS_BUCKETS,
    STREAM_TIME_BUCKETS_S,
    Histogram,
    StreamStatsRecorder,
)
from .policy import QueueState

__all__ = [
    "BATCH_COST_BUCKETS",
    "CHUNKS_BUCKETS",
    "QUEUE_WAIT_BUCKETS_S",
    "STREAM_TIME_BUCKETS_S",
    "BatcherStats",
    "Histogram",
    "ServiceStats",
    "StageStats",
    "StatsRecorder",
    "StreamStats",
    "StreamStatsRecorder",
]

QUEUE_WAIT_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
)  # fmt: skip
"""Upper bounds (seconds) of the queue-wait histogram."""

BATCH_COST_BUCKETS = tuple(float(4**power) for power in range(1, 12))
"""Upper bounds of the batch-cost histogram (4 to about 4 million cost units)."""


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A batcher's counters at one moment.

    Attributes:
        queued: Items waiting for a batch.
        in_flight: Items in batches that are running.
        batches: Batches released so far.
        items: Items released in those batches.
        mean_batch_size: Mean batch size in batch units (0.0 before the first).
        batch_sizes: Batch size (units) -> how many batches had it.
        queue_wait_p50_ms: Median time items waited before release (recent items).
        queue_wait_p90_ms: 90th percentile of that wait.
        queue_wait_p99_ms: 99th percentile of that wait.
        queue_wait_counts: Items released, per bucket of their queue wait: one
            count per bound of ``QUEUE_WAIT_BUCKETS_S`` (waits up to it, above
            the previous one), then the count above the last bound.
        queue_wait_sum_s: Total queue wait of every item released.
        expired: Items answered DeadlineExceeded.
        cancelled: Items whose caller stopped waiting.
        rejected: Items refused because the queue was full.
        failed: Items answered with an error by the batch function.
        batch_cost_sum: With ``cost_fn``: the cost of every batch released, as
            counted (padded or summed).
        useful_cost_sum: With ``cost_fn``: the summed cost of their items.
        batch_cost_counts: With ``cost_fn``: batches per bucket of their cost, one
            count per bound of ``BATCH_COST_BUCKETS``, then the count above the last.
        oom_splits: Batches (or parts of one) split because they ran out of memory.
        cost_ceiling: The batch-cost ceiling learned from out-of-memory errors (in
            cost units, or batch units without ``cost_fn``), or None.
    """

    queued: int
    in_flight: int
    batches: int
    items: int
    mean_batch_size: float
    batch_sizes: Mapping[int, int]
    queue_wait_p50_ms: float
    queue_wait_p90_ms: float
    queue_wait_p99_ms: float
    queue_wait_counts: tuple[int, ...]
    queue_wait_sum_s: float
    expired: int
    cancelled: int
    rejected: int
    failed: int
    batch_cost_sum: float = 0.0
    useful_cost_sum: float = 0.0
    batch_cost_counts: tuple[int, ...] = ()
    oom_splits: int = 0
    cost_ceiling: float | None = None

    @property
    def padding_efficiency(self) -> float:
        """Useful cost over batch cost (1.0 when nothing was padded, or no cost known)."""
        if self.batch_cost_sum <= 0:
            return 1.0
        return self.useful_cost_sum / self.batch_cost_sum

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickle ``batch_sizes`` (read-only, which pickle cannot copy) as a dict."""
        values = [getattr(self, field.name) for field in fields(self)]
        return _unpickle_stats, tuple(dict(v) if isinstance(v, Mapping) else v for v in values)


def _unpickle_stats(*values: object) -> BatcherStats:
    names = [field.name for field in fields(BatcherStats)]
    kwargs = dict(zip(names, values, strict=True))
    kwargs["batch_sizes"] = MappingProxyType(kwargs["batch_sizes"])  # type: ignore[arg-type]
    return BatcherStats(**kwargs)  # type: ignore[arg-type]


class StatsRecorder:
    """Accumulates a batcher's counters; the caller serialises access."""

    def __init__(self, wait_samples: int = 4096) -> None:
        self.batches = 0
        self.items = 0
        self.units = 0
        self.expired = 0
        self.cancelled = 0
        self.rejected = 0
        self.failed = 0
        self._sizes: Counter[int] = Counter()
        self._waits: deque[float] = deque(maxlen=wait_samples)
        self._wait_counts = [0] * (len(QUEUE_WAIT_BUCKETS_S) + 1)
        self._wait_sum_s = 0.0
        self.batch_cost_sum = 0.0
        self.useful_cost_sum = 0.0
        self._cost_counts = [0] * (len(BATCH_COST_BUCKETS) + 1)
        self.oom_splits = 0
        self.cost_ceiling: float | None = None

    def costed(self, cost: float, useful: float) -> None:
        """The batch just released costs ``cost`` as counted, ``useful`` summed."""
        self.batch_cost_sum += cost
        self.useful_cost_sum += useful
        self._cost_counts[bisect_left(BATCH_COST_BUCKETS, cost)] += 1

    def released(self, units: int, waits_s: list[float]) -> None:
        """One batch of ``units`` went out; ``waits_s`` holds each item's queue wait."""
        self._waits.extend(waits_s)
        counts = self._wait_counts
        for wait in waits_s:
            counts[bisect_left(QUEUE_WAIT_BUCKETS_S, wait)] += 1
        self._wait_sum_s += sum(waits_s)
        self.batches += 1
        self.items += len(waits_s)
        self.units += units
        self._sizes[units] += 1

    def snapshot(self, state: QueueState) -> BatcherStats:
        """A frozen copy of the counters and the queue's current state."""
        waits = sorted(self._waits)
        return BatcherStats(
            queued=state.count,
            in_flight=state.in_flight,
            batches=self.batches,
            items=self.items,
            mean_batch_size=self.units / self.batches if self.batches else 0.0,
            batch_sizes=MappingProxyType(dict(sorted(self._sizes.items()))),
            queue_wait_p50_ms=_percentile_ms(waits, 0.50),
            queue_wait_p90_ms=_percentile_ms(waits, 0.90),
            queue_wait_p99_ms=_percentile_ms(waits, 0.99),
            queue_wait_counts=tuple(self._wait_counts),
            queue_wait_sum_s=self._wait_sum_s,
            expired=self.expired,
            cancelled=self.cancelled,
            rejected=self.rejected,
            failed=self.failed,
            batch_cost_sum=self.batch_cost_sum,
            useful_cost_sum=self.useful_cost_sum,
            batch_cost_counts=tuple(self._cost_counts) if self.batch_cost_sum else (),
            oom_splits=self.oom_splits,
            cost_ceiling=self.cost_ceiling,
        )


def _percentile_ms(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))
    return ordered[index] * 1000.0


@dataclass(frozen=True)
class StageStats:
    """One stage at one moment: its workers and its batcher's counters (and, for a
    stage that streams, its stream counters)."""

    name: str
    workers: int
    workers_alive: int
    restarts: int
    batching: BatcherStats
    streams: StreamStats | None = None


@dataclass(frozen=True)
class ServiceStats:
    """The whole service at one moment.

    Attributes:
        ready: Warmed up, not draining, and every stage has a live worker.
        draining: :meth:`Service.close` has begun: no new items are taken.
        in_flight: Items inside the service (queued or computing, any stage).
        stages: One entry per stage, in order.
    """

    ready: bool
    draining: bool
    in_flight: int
    stages: tuple[StageStats, ...]


# -- streams (step-wise batching) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamStats:
    """The streams of a step-wise stage at one moment.

    Attributes:
        active: Streams stepped now.
        waiting: Streams waiting to join a step.
        opened: Streams opened so far.
        completed: Streams that ended complete.
        failed: Streams that ended with an error (their own, a deadline, a dead worker).
        left: Streams whose caller stopped reading first.
        rejected: Streams refused before they started (overload).
        steps: Steps run.
        step_seconds: Time the model spent in those steps.
        chunks: Chunks sent.
        first_chunk_counts: Streams per bucket of their time to first chunk (one
            count per bound of ``STREAM_TIME_BUCKETS_S``, then the count above).
        first_chunk_sum_s: Total time to first chunk.
        between_chunks_counts: Chunks after the first per bucket of the time since
            the previous chunk.
        between_chunks_sum_s: Total time between chunks.
        chunks_counts: Ended streams per bucket of their chunk count (bounds
            ``CHUNKS_BUCKETS``, then the count above).
        chunks_counts_sum: Chunks of the ended streams.
    """

    active: int
    waiting: int
    opened: int
    completed: int
    failed: int
    left: int
    rejected: int
    steps: int
    step_seconds: float
    chunks: int
    first_chunk_counts: tuple[int, ...]
    first_chunk_sum_s: float
    between_chunks_counts: tuple[int, ...]
    between_chunks_sum_s: float
    chunks_counts: tuple[int, ...]
    chunks_counts_sum: float

    @classmethod
    def of(cls, recorder: StreamStatsRecorder, active: int, waiting: int) -> StreamStats:
        """A frozen copy of ``recorder``'s counters, with the streams ``active`` and
        ``waiting`` now."""
        return cls(
            active=active,
            waiting=waiting,
            opened=recorder.opened,
            completed=recorder.completed,
            failed=recorder.failed,
            left=recorder.left,
            rejected=recorder.rejected,
            steps=recorder.steps,
            step_seconds=recorder.step_seconds,
            chunks=recorder.chunks,
            first_chunk_counts=tuple(recorder.first.counts),
            first_chunk_sum_s=recorder.first.total,
            between_chunks_counts=tuple(recorder.between.counts),
            between_chunks_sum_s=recorder.between.total,
            chunks_counts=tuple(recorder.lengths.counts),
            chunks_counts_sum=recorder.lengths.total,
        )
