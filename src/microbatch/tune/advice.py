"""Batching settings from measured batch times: the pure arithmetic of ``microbatch tune``.

A stage that runs a batch of ``n`` items in ``t(n)`` seconds on each of ``w``
workers serves at most ``w * n / t(n)`` items/s. Under full load an item may wait for
the batch ahead of it and then run in its own, so a cap of ``n`` items bounds its
time in the stage by about ``2 * t(n)``; under light load it is about ``t(1)``. The
advice raises each stage's cap, bottleneck first, while the pipeline's full-load
bound stays within the latency target and the larger batch still adds throughput.

A stage with a ``cost_fn`` is also advised a ``max_batch_cost``: the cost of its
advised batch of the examples. The pipeline's throughput is capped by the serving
path (decoding, queueing, encoding a request) when it was measured: timing the
model alone overstates what a server answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..policy import CostModel

__all__ = ["Advice", "Measurement", "StageAdvice", "StageCurve", "knee", "recommend"]


@dataclass(frozen=True)
class Measurement:
    """The median time of one batch of ``batch_size`` items, in seconds."""

    batch_size: int
    seconds: float


@dataclass(frozen=True)
class StageCurve:
    """What was measured for one stage.

    Attributes:
        name: The stage's name.
        workers: Its worker count (throughput is taken as ``workers`` times one's).
        points: Batch times by increasing batch size (at least one).
        memory_limit: The first batch size that ran out of memory, if one did.
        cost_per_item: With a ``cost_fn``: an example's cost as a batch counts it
            (the largest for padded batches, the mean for summed ones), else None.
    """

    name: str
    workers: int
    points: tuple[Measurement, ...]
    memory_limit: int | None = None
    cost_per_item: float | None = None

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError(f"stage {self.name!r}: no measurement")
        sizes = [p.batch_size for p in self.points]
        if sizes != sorted(set(sizes)) or sizes[0] < 1:
            raise ValueError(f"stage {self.name!r}: batch sizes must increase from 1, got {sizes}")
        if any(not p.seconds > 0 for p in self.points):
            raise ValueError(f"stage {self.name!r}: batch times must be > 0")
        if self.workers < 1:
            raise ValueError(f"stage {self.name!r}: workers must be >= 1, got {self.workers}")

    def items_per_s(self, point: Measurement) -> float:
        """Throughput of all the stage's workers running batches like ``point``."""
        return self.workers * point.batch_size / point.seconds


@dataclass(frozen=True)
class StageAdvice:
    """The settings advised for one stage and what to expect from them.

    Attributes:
        curve: The measurements behind it.
        max_batch_size: Advised cap on a batch.
        max_latency_ms: Advised latency bound: the stage's share of the target.
        batch_ms: Time of a batch of ``max_batch_size`` items.
        items_per_s: Throughput at that batch size (all workers).
        worst_latency_ms: About ``2 * batch_ms``: time in the stage under full load.
        knee: The batch size past which throughput grows by less than ``gain``.
        fixed_ms: Cost model fitted to the points: time per batch, ``a``.
        per_item_ms: Cost model fitted to the points: time per item, ``b``.
        max_batch_cost: With a ``cost_fn``: the advised cost budget, the cost of
            ``max_batch_size`` examples; else None.
    """

    curve: StageCurve
    max_batch_size: int
    max_latency_ms: float
    batch_ms: float
    items_per_s: float
    worst_latency_ms: float
    knee: int
    fixed_ms: float
    per_item_ms: float
    max_batch_cost: float | None = None


@dataclass(frozen=True)
class Advice:
    """The advice for a whole service.

    Attributes:
        p99_ms: The latency target it was made for.
        gain: The least relative throughput gain that is worth a larger batch.
        stages: One per stage, in order.
        items_per_s: The pipeline's throughput: its slowest stage's, or the
            serving path's when that is slower.
        bottleneck: The name of that stage (``"serving path"`` for the serving path).
        light_latency_ms: Time through the pipeline alone (batches of one).
        worst_latency_ms: Time through the pipeline under full load.
        feasible: Whether even batches of one meet the target.
        serving_items_per_s: Requests per second the serving path alone handles
            (None: not measured).
    """

    p99_ms: float
    gain: float
    stages: tuple[StageAdvice, ...]
    items_per_s: float
    bottleneck: str
    light_latency_ms: float
    worst_latency_ms: float
    feasible: bool
    serving_items_per_s: float | None = None


def knee(curve: StageCurve, gain: float = 0.05) -> int:
    """The smallest measured batch size that no larger one beats by ``gain`` or more.

    Comparing with every larger size, not only the next, keeps one noisy point
    from ending the growth early. The largest size measured is the knee when
    throughput was still growing there.
    """
    rates = [curve.items_per_s(p) for p in curve.points]
    for i, point in enumerate(curve.points):
        if all(later < (1.0 + gain) * rates[i] for later in rates[i + 1 :]):
            return point.batch_size
    raise AssertionError("unreachable: the last point always qualifies")


def recommend(
    curves: Sequence[StageCurve],
    p99_ms: float,
    gain: float = 0.05,
    serving_items_per_s: float | None = None,
) -> Advice:
    """Advise ``max_batch_size`` and ``max_latency_ms`` for each stage.

    Every stage starts at its smallest measured batch. Repeatedly, among the stages
    whose next measured size is within their :func:`knee` and keeps the pipeline's
    full-load bound ``sum(2 * t_k(n_k))`` within ``p99_ms``, the one with the lowest
    throughput moves to its next size. The latency target is then shared between
    the stages in proportion to their full-load bounds.

    Args:
        curves: The measured stages, in pipeline order.
        p99_ms: The latency target for the whole pipeline, in milliseconds.
        gain: Least relative throughput gain worth a larger batch (0.05 = 5%).
        serving_items_per_s: What the serving path alone handles; it caps the
            pipeline's throughput.

    Raises:
        ValueError: No stage, or a target or gain that is not positive.
    """
    if not curves:
        raise ValueError("no stage to advise on")
    if not p99_ms > 0:
        raise ValueError(f"p99_ms must be > 0, got {p99_ms!r}")
    if not gain >= 0:
        raise ValueError(f"gain must be >= 0, got {gain!r}")
    budget_s = p99_ms / 1000.0
    knees = [knee(curve, gain) for curve in curves]
    chosen = [0] * len(curves)

    def bound_s(k: int, index: int) -> float:
        return 2.0 * curves[k].points[index].seconds

    total_s = sum(bound_s(k, 0) for k in range(len(curves)))
    feasible = total_s <= budget_s
    while True:
        growable = [
            k
            for k, curve in enumerate(curves)
            if chosen[k] + 1 < len(curve.points)
            and curve.points[chosen[k] + 1].batch_size <= knees[k]
            and total_s - bound_s(k, chosen[k]) + bound_s(k, chosen[k] + 1) <= budget_s
        ]
        if not growable:
            break
        k = min(growable, key=lambda k: curves[k].items_per_s(curves[k].points[chosen[k]]))
        total_s += bound_s(k, chosen[k] + 1) - bound_s(k, chosen[k])
        chosen[k] += 1

    stages = tuple(
        _stage_advice(curve, curve.points[index], knees[k], p99_ms * bound_s(k, index) / total_s)
        for k, (curve, index) in enumerate(zip(curves, chosen, strict=True))
    )
    slowest = min(stages, key=lambda s: s.items_per_s)
    items_per_s, bottleneck = slowest.items_per_s, slowest.curve.name
    if serving_items_per_s is not None and serving_items_per_s < items_per_s:
        items_per_s, bottleneck = serving_items_per_s, "serving path"
    return Advice(
        p99_ms=p99_ms,
        gain=gain,
        stages=stages,
        items_per_s=items_per_s,
        bottleneck=bottleneck,
        light_latency_ms=sum(1000.0 * c.points[0].seconds for c in curves),
        worst_latency_ms=1000.0 * total_s,
        feasible=feasible,
        serving_items_per_s=serving_items_per_s,
    )


def _stage_advice(
    curve: StageCurve, point: Measurement, knee_size: int, share_ms: float
) -> StageAdvice:
    cost = CostModel(forgetting=1.0)
    for p in curve.points:
        cost.observe(p.batch_size, p.seconds)
    return StageAdvice(
        curve=curve,
        max_batch_size=point.batch_size,
        max_latency_ms=share_ms,
        batch_ms=1000.0 * point.seconds,
        items_per_s=curve.items_per_s(point),
        worst_latency_ms=2000.0 * point.seconds,
        knee=knee_size,
        fixed_ms=1000.0 * cost.fixed_s,
        per_item_ms=1000.0 * cost.per_unit_s,
        max_batch_cost=None
        if curve.cost_per_item is None
        else point.batch_size * curve.cost_per_item,
    )
