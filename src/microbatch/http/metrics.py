"""Prometheus metrics of one HTTP app, in its own registry.

Request counts and latencies are recorded as requests finish; everything about the
service (queues, batches, workers) is read from ``stats()`` when Prometheus scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ..stats import (
    BATCH_COST_BUCKETS,
    CHUNKS_BUCKETS,
    QUEUE_WAIT_BUCKETS_S,
    STREAM_TIME_BUCKETS_S,
    ServiceStats,
)
from .request_tally import RequestTally

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "HttpMetrics",
    "RequestCollector",
    "RequestCounts",
    "ServiceCollector",
]

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds of the batch-size histogram (batch units)."""

_LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class ServiceCollector(Collector):
    """Turns one ``stats()`` snapshot into metric families at each scrape."""

    def __init__(self, stats: Callable[[], ServiceStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        """Yield the service's metric families (see the README for the list)."""
        stats = self._stats()
        ready = GaugeMetricFamily("microbatch_ready", "1 when the service takes traffic")
        ready.add_metric([], 1.0 if stats.ready else 0.0)
        items = GaugeMetricFamily("microbatch_items_in_service", "Items inside the service")
        items.add_metric([], stats.in_flight)
        yield ready
        yield items
        label = ["stage"]
        queued = GaugeMetricFamily(
            "microbatch_queue_depth", "Items waiting for a batch", labels=label
        )
        running = GaugeMetricFamily(
            "microbatch_in_flight_items", "Items in batches that are running", labels=label
        )
        alive = GaugeMetricFamily(
            "microbatch_workers_alive", "Workers able to take a batch", labels=label
        )
        restarts = CounterMetricFamily(
            "microbatch_worker_restarts", "Workers started again after dying", labels=label
        )
        batches = CounterMetricFamily("microbatch_batches", "Batches released", labels=label)
        dropped = CounterMetricFamily(
            "microbatch_items_dropped",
            "Items answered without a result, by reason (deadline, cancelled, rejected, failed)",
            labels=["stage", "reason"],
        )
        wait = HistogramMetricFamily(
            "microbatch_queue_wait_seconds",
            "Time items waited in the queue for a batch",
            labels=label,
        )
        sizes = HistogramMetricFamily(
            "microbatch_batch_size", "Batch sizes (batch units)", labels=label
        )
        for stage in stats.stages:
            name, counts = [stage.name], stage.batching
            queued.add_metric(name, counts.queued)
            running.add_metric(name, counts.in_flight)
            alive.add_metric(name, stage.workers_alive)
            restarts.add_metric(name, stage.restarts)
            batches.add_metric(name, counts.batches)
            for reason, value in (
                ("deadline", counts.expired),
                ("cancelled", counts.cancelled),
                ("rejected", counts.rejected),
                ("failed", counts.failed),
            ):
                dropped.add_metric([stage.name, reason], value)
            wait.add_metric(
                name,
                _cumulative_counts(QUEUE_WAIT_BUCKETS_S, counts.queue_wait_counts),
                sum_value=counts.queue_wait_sum_s,
            )
            buckets, total = _cumulative(counts.batch_sizes)
            sizes.add_metric(name, buckets, sum_value=total)
        yield from (queued, running, alive, restarts, batches, dropped, wait, sizes)
        yield from _stream_families(stats)
        yield from _composition(stats)


def _stream_families(stats: ServiceStats) -> Iterator[Metric]:
    """The families of the stages that stream (none when no stage does)."""
    streaming = [stage for stage in stats.stages if stage.streams is not None]
    if not streaming:
        return
    label = ["stage"]
    active = GaugeMetricFamily("microbatch_active_streams", "Streams stepped now", labels=label)
    waiting = GaugeMetricFamily(
        "microbatch_waiting_streams", "Streams waiting to join a step", labels=label
    )
    steps = CounterMetricFamily(
        "microbatch_steps", "Steps run (rate(): steps per second)", labels=label
    )
    step_time = CounterMetricFamily(
        "microbatch_step_seconds", "Time the model spent in steps", labels=label
    )
    chunks = CounterMetricFamily("microbatch_stream_chunks", "Chunks sent", labels=label)
    ended = CounterMetricFamily(
        "microbatch_streams",
        "Streams by how they ended (completed, failed, left, rejected)",
        labels=["stage", "outcome"],
    )
    first = HistogramMetricFamily(
        "microbatch_stream_first_chunk_seconds",
        "Time from a stream's arrival to its first chunk",
        labels=label,
    )
    between = HistogramMetricFamily(
        "microbatch_stream_between_chunks_seconds",
        "Time between two chunks of a stream",
        labels=label,
    )
    lengths = HistogramMetricFamily(
        "microbatch_stream_chunks_per_stream", "Chunks per ended stream", labels=label
    )
    for stage in streaming:
        name, counts = [stage.name], stage.streams
        assert counts is not None
        active.add_metric(name, counts.active)
        waiting.add_metric(name, counts.waiting)
        steps.add_metric(name, counts.steps)
        step_time.add_metric(name, counts.step_seconds)
        chunks.add_metric(name, counts.chunks)
        for outcome, value in (
            ("completed", counts.completed),
            ("failed", counts.failed),
            ("left", counts.left),
            ("rejected", counts.rejected),
        ):
            ended.add_metric([stage.name, outcome], value)
        first.add_metric(
            name,
            _cumulative_counts(STREAM_TIME_BUCKETS_S, counts.first_chunk_counts),
            sum_value=counts.first_chunk_sum_s,
        )
        between.add_metric(
            name,
            _cumulative_counts(STREAM_TIME_BUCKETS_S, counts.between_chunks_counts),
            sum_value=counts.between_chunks_sum_s,
        )
        lengths.add_metric(
            name,
            _cumulative_counts(CHUNKS_BUCKETS, counts.chunks_counts),
            sum_value=counts.chunks_counts_sum,
        )
    yield from (active, waiting, steps, step_time, chunks, ended, first, between, lengths)


def _composition(stats: ServiceStats) -> Iterator[Metric]:
    """Batch composition: padding efficiency and batch cost (stages with ``cost_fn``),
    out-of-memory splits and the learned cost ceiling (every stage)."""
    label = ["stage"]
    efficiency = GaugeMetricFamily(
        "microbatch_padding_efficiency",
        "Useful cost over padded batch cost of the batches released (1: no padding)",
        labels=label,
    )
    cost = HistogramMetricFamily(
        "microbatch_batch_cost", "Batch cost (cost_fn units, as counted)", labels=label
    )
    splits = CounterMetricFamily(
        "microbatch_oom_splits", "Batches split because they ran out of memory", labels=label
    )
    ceiling = GaugeMetricFamily(
        "microbatch_batch_cost_ceiling",
        "Batch cost ceiling learned from out-of-memory errors",
        labels=label,
    )
    for stage in stats.stages:
        name, counts = [stage.name], stage.batching
        if counts.batch_cost_counts:
            efficiency.add_metric(name, counts.padding_efficiency)
            cost.add_metric(
                name,
                _cumulative_counts(BATCH_COST_BUCKETS, counts.batch_cost_counts),
                sum_value=counts.batch_cost_sum,
            )
        splits.add_metric(name, counts.oom_splits)
        if counts.cost_ceiling is not None:
            ceiling.add_metric(name, counts.cost_ceiling)
    yield from (efficiency, cost, splits, ceiling)


def _cumulative(batch_sizes: Mapping[int, int]) -> tuple[list[tuple[str, float]], float]:
    """Prometheus buckets (cumulative counts per upper bound) and the sum of sizes."""
    pairs = sorted(batch_sizes.items())
    buckets: list[tuple[str, float]] = []
    for bound in BATCH_SIZE_BUCKETS:
        buckets.append((str(bound), float(sum(count for size, count in pairs if size <= bound))))
    buckets.append(("+Inf", float(sum(count for _, count in pairs))))
    return buckets, float(sum(size * count for size, count in pairs))


@dataclass
class RequestCounts:
    """Request counts by route and status, and latency histograms by route, as plain
    data: what one process has served, to be sent to another and added up.

    Attributes:
        statuses: Requests by ``(route, status)``.
        latencies: Per route: the count in each latency bucket (the last: above every
            bound) and the sum of latencies in seconds.
    """

    statuses: dict[tuple[str, int], int] = field(default_factory=dict)
    latencies: dict[str, tuple[list[int], float]] = field(default_factory=dict)

    def add(self, other: RequestCounts) -> None:
        """Add ``other``'s counts to these."""
        for key, count in other.statuses.items():
            self.statuses[key] = self.statuses.get(key, 0) + count
        for route, (counts, total) in other.latencies.items():
            mine = self.latencies.get(route)
            if mine is None:
                self.latencies[route] = (list(counts), total)
            else:
                summed = [a + b for a, b in zip(mine[0], counts, strict=True)]
                self.latencies[route] = (summed, mine[1] + total)


class RequestCollector(Collector):
    """Counts finished requests by route and status, and their latencies by route.

    Recording is a few field updates in the compiled :attr:`tally`, with no lock
    (the event loop records from one thread). Prometheus families are built
    only when it scrapes. Under ``serve --workers N`` each HTTP process records its
    own requests and learns the others' as :attr:`others`; a scrape shows the sum.
    """

    def __init__(self) -> None:
        self.tally = RequestTally(_LATENCY_BUCKETS_S)
        """Where this process's requests are counted."""
        self.record = self.tally.record
        """Count one finished request and its latency: ``record(route, status, seconds)``."""
        self.others = RequestCounts()

    def snapshot(self) -> RequestCounts:
        """What this process has recorded so far (a copy)."""
        statuses: dict[tuple[str, int], int] = {}
        latencies: dict[str, tuple[list[int], float]] = {}
        for route, tally in self.tally.routes.items():
            for status, count in tally.statuses().items():
                statuses[route, status] = count
            latencies[route] = (list(tally.buckets), tally.seconds)
        return RequestCounts(statuses, latencies)

    def collect(self) -> Iterator[Metric]:
        """Yield the request counter and the latency histogram."""
        counts = self.snapshot()
        counts.add(self.others)
        requests = CounterMetricFamily(
            "microbatch_http_requests",
            "HTTP requests by route and status",
            labels=["route", "status"],
        )
        for (route, status), count in sorted(counts.statuses.items()):
            requests.add_metric([route, str(status)], count)
        latency = HistogramMetricFamily(
            "microbatch_http_request_duration_seconds",
            "Time from request start to response, by route",
            labels=["route"],
        )
        for route, (buckets, total) in sorted(counts.latencies.items()):
            cumulative = _cumulative_counts(_LATENCY_BUCKETS_S, buckets)
            latency.add_metric([route], cumulative, sum_value=total)
        yield requests
        yield latency


def _cumulative_counts(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Prometheus buckets from per-bucket counts (the last one: above every bound)."""
    running = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip((*map(str, bounds), "+Inf"), counts, strict=True):
        running += count
        buckets.append((bound, float(running)))
    return buckets


class HttpMetrics:
    """The app's registry: per-request counters and latencies, the service's stats,
    and the serving process's own (``process_*``: memory, CPU, open files;
    ``python_gc_*``: the garbage collector's passes and what they found).

    Args:
        stats: Where the service's snapshot comes from at each scrape.
    """

    content_type = CONTENT_TYPE_LATEST.encode()

    def __init__(self, stats: Callable[[], ServiceStats]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = RequestCollector()
        self.registry.register(self.requests)
        self.registry.register(ServiceCollector(stats))
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.record = self.requests.record

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
