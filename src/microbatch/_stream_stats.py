"""The counters of a step loop's streams (:class:`StreamStatsRecorder`): added to
for every chunk a step hands out, so the wheel compiles this module;
:mod:`microbatch.stats` re-exports it, and makes its snapshot
(:meth:`~microbatch.stats.StreamStats.of`)."""

from __future__ import annotations

from bisect import bisect_left

from ._channel import Channel

__all__ = ["CHUNKS_BUCKETS", "STREAM_TIME_BUCKETS_S", "Histogram", "StreamStatsRecorder"]

STREAM_TIME_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds (seconds) of the time-to-first-chunk and time-between-chunks histograms."""

CHUNKS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
"""Upper bounds of the chunks-per-stream histogram."""


class Histogram:
    """Counts per bucket (``counts[i]``: values up to ``bounds[i]``; the last: above)
    and the sum of the values; the caller serialises access."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def add(self, value: float) -> None:
        """Count one value."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class StreamStatsRecorder:
    """Accumulates a step loop's stream counters, and its histograms of the time to
    first chunk (``first``), the time between chunks (``between``) and the chunks per
    ended stream (``lengths``); one event loop: no locks."""

    def __init__(self) -> None:
        self.opened = 0
        self.completed = 0
        self.failed = 0
        self.left = 0
        self.rejected = 0
        self.steps = 0
        self.step_seconds = 0.0
        self.chunks = 0
        self.first = Histogram(STREAM_TIME_BUCKETS_S)
        self.between = Histogram(STREAM_TIME_BUCKETS_S)
        self.lengths = Histogram(tuple(float(b) for b in CHUNKS_BUCKETS))

    def stepped(self, active: int, started_s: float | None, finished_s: float | None) -> None:
        """One step ran over ``active`` items."""
        self.steps += 1
        if started_s is not None and finished_s is not None:
            self.step_seconds += max(0.0, finished_s - started_s)

    def chunk(self, stream: Channel, now: float) -> None:
        """``stream`` gets a chunk at ``now`` (before it is pushed)."""
        self.chunks += 1
        last = stream.last_chunk_s
        if last is None:
            histogram, seconds = self.first, now - stream.opened_s
        else:
            histogram, seconds = self.between, now - last
        histogram.counts[bisect_left(STREAM_TIME_BUCKETS_S, seconds)] += 1  # add(), inline
        histogram.total += seconds

    def ended(self, stream: Channel, now: float) -> None:
        """``stream`` ended at ``now``."""
        if stream.left:
            self.left += 1
        elif stream.error is not None:
            self.failed += 1
        else:
            self.completed += 1
        self.lengths.add(float(stream.chunks_sent))
