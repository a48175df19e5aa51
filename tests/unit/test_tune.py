"""The arithmetic of ``microbatch tune`` on synthetic cost curves, and its timing loop
driven by a fake timer (no real time is measured)."""

from __future__ import annotations

from typing import Any

import pytest

from microbatch.pipeline import Model
from microbatch.tune import (
    Measurement,
    StageCurve,
    batch_sizes,
    knee,
    measure_model,
    recommend,
    to_json,
    to_text,
)

SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


def curve(
    fixed_s: float,
    per_item_s: float,
    name: str = "model",
    workers: int = 1,
    sizes: list[int] = SIZES,
) -> StageCurve:
    """Batch time a + b * n at each size."""
    points = tuple(Measurement(n, fixed_s + per_item_s * n) for n in sizes)
    return StageCurve(name, workers, points)


def test_accelerator_like_cost_gets_big_batches_under_a_generous_target() -> None:
    advice = recommend([curve(0.002, 0.00002)], p99_ms=50)  # 2 ms + 20 us per item
    (stage,) = advice.stages
    assert stage.max_batch_size == 128  # 2 * t(128) = 9.1 ms is well within 50 ms
    assert stage.items_per_s == pytest.approx(128 / 0.00456)
    assert stage.max_latency_ms == pytest.approx(50)
    assert stage.fixed_ms == pytest.approx(2.0) and stage.per_item_ms == pytest.approx(0.02)
    assert advice.feasible and advice.worst_latency_ms == pytest.approx(9.12)


def test_a_tight_target_caps_the_batch_by_latency() -> None:
    # 2 * t(n) <= 6 ms  <=>  n <= 50: the largest measured size within is 32
    (stage,) = recommend([curve(0.002, 0.00002)], p99_ms=6).stages
    assert stage.max_batch_size == 32
    assert stage.worst_latency_ms <= 6


def test_a_steep_per_item_cost_keeps_batches_small() -> None:
    # 0.1 ms + 5 ms per item: batches barely raise throughput (1 -> 2: +2%)
    advice = recommend([curve(0.0001, 0.005)], p99_ms=1000)
    (stage,) = advice.stages
    assert stage.knee == 1
    assert stage.max_batch_size == 1
    assert "stops growing past batch 1" in to_text(advice)


def test_the_knee_is_where_throughput_stops_growing_by_the_gain() -> None:
    # throughput n / (a + b n) saturates near a / b = 10 items: growth by 5% ends at 128
    assert knee(curve(0.010, 0.001), gain=0.05) == 128
    assert knee(curve(0.010, 0.001), gain=0.25) == 32
    flat = StageCurve("m", 1, tuple(Measurement(n, 0.001 * n) for n in SIZES))
    assert knee(flat) == 1


def test_one_noisy_point_does_not_end_the_growth() -> None:
    times = {1: 0.010, 2: 0.011, 4: 0.0225, 8: 0.013, 16: 0.016}  # 4 is a slow outlier
    noisy = StageCurve("m", 1, tuple(Measurement(n, t) for n, t in times.items()))
    assert knee(noisy) == 16


def test_an_unreachable_target_advises_batches_of_one_and_says_so() -> None:
    advice = recommend([curve(0.030, 0.001)], p99_ms=20)  # one item: 31 ms
    assert not advice.feasible
    assert advice.stages[0].max_batch_size == 1
    assert "cannot be met" in to_text(advice)


def test_the_bottleneck_stage_grows_first_and_the_target_is_shared() -> None:
    cheap = curve(0.0005, 0.00001, name="tokenize")  # far faster at any size
    costly = curve(0.004, 0.0005, name="encode")
    advice = recommend([cheap, costly], p99_ms=40)
    tokenize, encode = advice.stages
    assert advice.bottleneck == "encode"
    assert encode.max_batch_size == 16  # 2 * t(32) = 40 ms would leave nothing for tokenize
    assert tokenize.max_batch_size > 1  # grows with what is left
    assert advice.worst_latency_ms <= 40
    assert tokenize.max_latency_ms + encode.max_latency_ms == pytest.approx(40)
    assert encode.max_latency_ms > tokenize.max_latency_ms
    assert advice.items_per_s == encode.items_per_s


def test_workers_multiply_throughput_not_latency() -> None:
    one = recommend([curve(0.002, 0.001)], p99_ms=30).stages[0]
    two = recommend([curve(0.002, 0.001, workers=2)], p99_ms=30).stages[0]
    assert two.max_batch_size == one.max_batch_size
    assert two.items_per_s == pytest.approx(2 * one.items_per_s)


def test_json_has_every_stage_and_its_measurements() -> None:
    advice = recommend([curve(0.001, 0.0001, name="a"), curve(0.002, 0.0002, name="b")], 100)
    data = to_json(advice, "pkg.mod:service")
    assert data["target"] == "pkg.mod:service"
    assert [s["name"] for s in data["stages"]] == ["a", "b"]
    first = data["stages"][0]
    assert [m["batch_size"] for m in first["measurements"]] == SIZES
    assert set(first["recommended"]) == {"max_batch_size", "max_batch_cost", "max_latency_ms"}
    assert first["recommended"]["max_batch_cost"] is None  # no cost_fn


def test_a_stage_with_a_cost_fn_is_advised_a_cost_budget() -> None:
    measured = curve(0.001, 0.0001)
    costed = StageCurve(measured.name, 1, measured.points, cost_per_item=40.0)
    stage = recommend([costed], p99_ms=100).stages[0]
    assert stage.max_batch_cost == stage.max_batch_size * 40.0
    assert "max_batch_cost=" in to_text(recommend([costed], p99_ms=100))


def test_the_serving_path_caps_the_throughput_estimate() -> None:
    fast_model = [curve(0.0001, 0.000001)]
    alone = recommend(fast_model, p99_ms=100)
    served = recommend(fast_model, p99_ms=100, serving_items_per_s=7_700.0)
    assert alone.items_per_s > 7_700.0
    assert served.items_per_s == 7_700.0 and served.bottleneck == "serving path"
    assert "serving path" in to_text(served)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ((), "no measurement"),
        ((Measurement(2, 0.1), Measurement(1, 0.1)), "increase"),
        ((Measurement(1, 0.0),), "> 0"),
    ],
)
def test_bad_curves_are_refused(points: tuple[Measurement, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StageCurve("m", 1, points)


def test_bad_targets_are_refused() -> None:
    with pytest.raises(ValueError, match="p99_ms"):
        recommend([curve(0.001, 0.001)], p99_ms=0)
    with pytest.raises(ValueError, match="no stage"):
        recommend([], p99_ms=10)


def test_batch_sizes_double_up_to_the_limit() -> None:
    assert batch_sizes(1) == [1]
    assert batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]


class FakeTimer:
    """A clock that only the fake model moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Costly(Model):
    """Takes 1 ms + 0.1 ms per item on the fake timer; out of memory above 16 items."""

    def __init__(self, timer: FakeTimer) -> None:
        self.timer = timer
        self.calls: list[int] = []

    def predict(self, batch: list[Any]) -> list[Any]:
        if len(batch) > 16:
            raise MemoryError
        self.calls.append(len(batch))
        self.timer.now += 0.001 + 0.0001 * len(batch) + 0.001 * (len(self.calls) % 3 == 0)
        return batch


def test_measuring_takes_the_median_after_warmup_and_stops_at_out_of_memory() -> None:
    timer = FakeTimer()
    model = Costly(timer)
    points, memory_limit = measure_model(
        model, ["a", "b", "c"], [1, 4, 16, 32, 64], repeats=3, warmup=1, timer=timer
    )
    assert [p.batch_size for p in points] == [1, 4, 16]
    assert [p.seconds for p in points] == pytest.approx([0.0011, 0.0014, 0.0026])  # spikes out
    assert memory_limit == 32
    assert model.calls == [1] * 4 + [4] * 4 + [16] * 4
