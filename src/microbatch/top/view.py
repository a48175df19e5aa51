"""What ``microbatch top`` shows: rates, percentiles and distributions over the
interval between two snapshots (or since the server started, for the first one)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .snapshot import Buckets, Snapshot, StageSnapshot

__all__ = ["PREDICT_ROUTE", "StageView", "View", "quantile", "view_between"]

PREDICT_ROUTE = "/predict"


@dataclass(frozen=True)
class StageView:
    """One stage over the interval.

    Attributes:
        batches_per_s: Batches released per second.
        mean_batch_size: Mean batch size (batch units) over the interval.
        batch_sizes: Share of the interval's batches per size bucket, as
            (upper bound, share), the bounds in order; with no batch in the
            interval, of every batch since the server started (so is the mean).
        queue_depth: Items waiting for a batch now.
        in_flight_items: Items in running batches now.
        workers_alive: Workers able to take a batch now.
        restarts: Worker restarts since the server started.
        new_restarts: Of which during the interval.
        deadline_misses_per_s: Items dropped past their deadline, per second.
    """

    batches_per_s: float
    mean_batch_size: float
    batch_sizes: tuple[tuple[float, float], ...]
    queue_depth: float
    in_flight_items: float
    workers_alive: float
    restarts: float
    new_restarts: float
    deadline_misses_per_s: float


@dataclass(frozen=True)
class View:
    """The server over the interval ``seconds`` long.

    Attributes:
        seconds: Length of the interval (0: the first scrape, rates unknown).
        requests_per_s: ``/predict`` requests finished per second.
        statuses_per_s: Every route's requests per second, by status.
        p50_s, p99_s: ``/predict`` latency percentiles over the interval (NaN: none).
        ready: Whether the service takes traffic.
        items_in_service: Items inside the service now.
        stages: Per stage.
    """

    seconds: float
    requests_per_s: float
    statuses_per_s: Mapping[str, float]
    p50_s: float
    p99_s: float
    ready: bool
    items_in_service: float
    stages: Mapping[str, StageView] = field(default_factory=dict)


def view_between(previous: Snapshot | None, current: Snapshot) -> View:
    """The figures of the interval from ``previous`` to ``current``; with no
    previous snapshot, the figures since the server started, with no rates."""
    seconds = 0.0 if previous is None else max(current.taken_at - previous.taken_at, 0.0)
    before = previous if previous is not None else Snapshot(current.taken_at)

    def rate(now: float, then: float) -> float:
        return max(now - then, 0.0) / seconds if seconds > 0 else math.nan

    predict = [(key, count) for key, count in current.requests.items() if key[0] == PREDICT_ROUTE]
    requests_per_s = rate(
        sum(count for _, count in predict),
        sum(before.requests.get(key, 0.0) for key, _ in predict),
    )
    statuses: dict[str, float] = {}
    for key, count in current.requests.items():
        statuses[key[1]] = statuses.get(key[1], 0.0) + rate(count, before.requests.get(key, 0.0))
    latency = _delta(
        current.latencies.get(PREDICT_ROUTE, ()), before.latencies.get(PREDICT_ROUTE, ())
    )
    stages = {
        name: _stage(stage, before.stages.get(name, StageSnapshot()), rate)
        for name, stage in current.stages.items()
    }
    return View(
        seconds,
        requests_per_s,
        dict(sorted(statuses.items())),
        quantile(0.5, latency),
        quantile(0.99, latency),
        current.ready,
        current.items_in_service,
        stages,
    )


def _stage(
    now: StageSnapshot, then: StageSnapshot, rate: Callable[[float, float], float]
) -> StageView:
    batches_before, restarts_before = then.batches, then.restarts
    deadline_before = then.dropped.get("deadline", 0.0)
    sizes = _delta(now.batch_sizes, then.batch_sizes)
    count = sizes[-1][1] if sizes else 0.0
    if not count:  # no batch in the interval: the sizes since the server started
        then, sizes = StageSnapshot(), now.batch_sizes
        count = sizes[-1][1] if sizes else 0.0
    shares: list[tuple[float, float]] = []
    below = 0.0
    for bound, cumulative in sizes:
        shares.append((bound, (cumulative - below) / count if count else 0.0))
        below = cumulative
    total = now.batch_size_sum - then.batch_size_sum
    return StageView(
        batches_per_s=rate(now.batches, batches_before),
        mean_batch_size=total / count if count else math.nan,
        batch_sizes=tuple(shares),
        queue_depth=now.queue_depth,
        in_flight_items=now.in_flight_items,
        workers_alive=now.workers_alive,
        restarts=now.restarts,
        new_restarts=max(now.restarts - restarts_before, 0.0),
        deadline_misses_per_s=rate(now.dropped.get("deadline", 0.0), deadline_before),
    )


def _delta(now: Buckets, then: Buckets) -> Buckets:
    """The histogram of what happened between two scrapes (``then`` empty: all)."""
    earlier = dict(then)
    return tuple((bound, max(count - earlier.get(bound, 0.0), 0.0)) for bound, count in now)


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """The ``q`` quantile of a cumulative histogram, interpolated linearly within its
    bucket as Prometheus' ``histogram_quantile`` does; NaN when it is empty. A
    quantile in the last (+inf) bucket is the highest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = (bound if not math.isinf(bound) else lower_bound), count
    return lower_bound
