"""One scrape of a server's ``/metrics``, as plain numbers."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Buckets", "Snapshot", "StageSnapshot", "parse_metrics"]

Buckets = tuple[tuple[float, float], ...]
"""A histogram: (upper bound, cumulative count), in order, the last bound +inf."""


@dataclass(frozen=True)
class StageSnapshot:
    """One stage's figures at one scrape."""

    queue_depth: float = 0.0
    in_flight_items: float = 0.0
    workers_alive: float = 0.0
    restarts: float = 0.0
    batches: float = 0.0
    dropped: Mapping[str, float] = field(default_factory=dict)  # by reason
    batch_sizes: Buckets = ()
    batch_size_sum: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    """A server's figures at one scrape, taken at ``taken_at`` (monotonic seconds).

    Attributes:
        requests: Requests so far by (route, status).
        latencies: Per route, the latency histogram so far.
        stages: Per stage name.
        ready: Whether the service takes traffic.
        items_in_service: Items inside the service now.
    """

    taken_at: float
    requests: Mapping[tuple[str, str], float] = field(default_factory=dict)
    latencies: Mapping[str, Buckets] = field(default_factory=dict)
    stages: Mapping[str, StageSnapshot] = field(default_factory=dict)
    ready: bool = False
    items_in_service: float = 0.0


_STAGE_GAUGES = {
    "microbatch_queue_depth": "queue_depth",
    "microbatch_in_flight_items": "in_flight_items",
    "microbatch_workers_alive": "workers_alive",
    "microbatch_worker_restarts_total": "restarts",
    "microbatch_batches_total": "batches",
    "microbatch_batch_size_sum": "batch_size_sum",
}


class _Stage:
    """A stage's figures while a scrape is read."""

    def __init__(self) -> None:
        self.numbers: dict[str, float] = {}
        self.dropped: dict[str, float] = {}
        self.batch_sizes: list[tuple[float, float]] = []

    def snapshot(self) -> StageSnapshot:
        return StageSnapshot(
            **self.numbers, dropped=self.dropped, batch_sizes=tuple(sorted(self.batch_sizes))
        )


def parse_metrics(text: str, taken_at: float) -> Snapshot:
    """The snapshot in Prometheus text ``text``.

    Raises:
        ValueError: The text is not in Prometheus' exposition format.
    """
    requests: dict[tuple[str, str], float] = {}
    latencies: dict[str, list[tuple[float, float]]] = {}
    stages: dict[str, _Stage] = {}
    ready, items = False, 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name == "microbatch_http_requests_total":
                requests[(labels["route"], labels["status"])] = value
            elif name == "microbatch_http_request_duration_seconds_bucket":
                latencies.setdefault(labels["route"], []).append((_bound(labels["le"]), value))
            elif name == "microbatch_ready":
                ready = value >= 1
            elif name == "microbatch_items_in_service":
                items = value
            elif "stage" in labels:
                stage = stages.setdefault(labels["stage"], _Stage())
                if name in _STAGE_GAUGES:
                    stage.numbers[_STAGE_GAUGES[name]] = value
                elif name == "microbatch_items_dropped_total":
                    stage.dropped[labels["reason"]] = value
                elif name == "microbatch_batch_size_bucket":
                    stage.batch_sizes.append((_bound(labels["le"]), value))
    return Snapshot(
        taken_at,
        requests,
        {route: tuple(sorted(buckets)) for route, buckets in latencies.items()},
        {name: stage.snapshot() for name, stage in stages.items()},
        ready,
        items,
    )


def _bound(text: str) -> float:
    return math.inf if text in ("+Inf", "Inf") else float(text)
