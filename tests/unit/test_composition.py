"""Batch composition: cost budgets, grouping by cost, the age bound, and settings."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch import AdaptivePolicy, BatchConfig, CooperativeBatcher, QueueState
from microbatch._intake import Intake
from microbatch._queue import Pending
from microbatch.composition import Composer, batch_cost
from microbatch.errors import ItemTooLarge
from microbatch.policy import ShapeCostModel


@dataclass
class Entry:
    id: int
    cost: float
    arrival: float
    size: int = 1
    rows: int = 1

    @property
    def peak(self) -> float:
        return self.cost


def test_padded_cost_is_the_largest_row_cost_times_the_rows() -> None:
    entries = [Entry(0, 3.0, 0.0), Entry(1, 10.0, 0.0), Entry(2, 1.0, 0.0)]
    assert batch_cost(entries, "padded") == 30.0
    assert batch_cost(entries, "sum") == 14.0


def test_first_in_first_out_stops_at_the_first_item_over_the_budget() -> None:
    composer = Composer(8, 20.0, "padded")
    entries = [Entry(0, 2.0, 0.0), Entry(1, 9.0, 0.1), Entry(2, 1.0, 0.2)]
    assert [e.id for e in composer.choose(entries, now=1.0)] == [0, 1]


def test_grouping_takes_the_cheapest_items_together_first() -> None:
    composer = Composer(3, None, "padded", group=True, max_wait_s=10.0)
    costs = [5.0, 100.0, 6.0, 90.0, 4.0, 95.0, 7.0]
    entries = [Entry(i, cost, 0.1 * i) for i, cost in enumerate(costs)]
    chosen = composer.choose(entries, now=1.0)
    assert [e.id for e in chosen] == [0, 2, 4]  # 4, 5 and 6: the cheapest, in arrival order
    rest = [e for e in entries if e not in chosen]
    # 7 goes alone: with 90 the batch would be half padding.
    assert [e.id for e in composer.choose(rest, now=1.0)] == [6]
    rest = [e for e in rest if e.id != 6]
    assert [e.id for e in composer.choose(rest, now=1.0)] == [1, 3, 5]


def test_past_the_age_bound_the_batch_forms_around_the_oldest() -> None:
    composer = Composer(2, None, "padded", group=True, max_wait_s=1.0)
    entries = [Entry(0, 100.0, 0.0), Entry(1, 1.0, 0.5), Entry(2, 90.0, 2.5), Entry(3, 2.0, 2.6)]
    assert [e.id for e in composer.choose(entries, now=0.9)] == [1, 3]  # not yet: cheapest
    assert [e.id for e in composer.choose(entries, now=1.0)] == [0, 2]  # the oldest and 90


def test_a_learned_ceiling_lowers_the_cost_limit_but_an_item_still_goes_alone() -> None:
    composer = Composer(8, 100.0, "sum")
    composer.ceiling = 10.0
    assert composer.cost_limit == 10.0
    entries = [Entry(0, 30.0, 0.0), Entry(1, 1.0, 0.1)]
    assert [e.id for e in composer.choose(entries, now=0.0)] == [0]


costs = st.lists(st.floats(0.5, 64.0), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(
    costs=costs,
    budget=st.floats(64.0, 400.0),
    size=st.integers(1, 12),
    mode=st.sampled_from(["padded", "sum"]),
    group=st.booleans(),
    window=st.integers(1, 40),
)
def test_every_item_is_taken_once_and_no_batch_is_over_its_limits(
    costs: list[float], budget: float, size: int, mode: str, group: bool, window: int
) -> None:
    composer = Composer(size, budget, mode, group=group, window=window, max_wait_s=5.0)  # type: ignore[arg-type]
    queue = [Entry(i, cost, float(i)) for i, cost in enumerate(costs)]
    taken: list[int] = []
    now = float(len(costs))
    while queue:
        batch = composer.choose(queue, now)
        assert batch, "an empty batch from a non-empty queue"
        if not group:
            assert batch[0] is queue[0], "first in, first out: the oldest goes first"
        assert len(batch) <= size
        if len(batch) > 1:
            assert batch_cost(batch, mode) <= budget + 1e-9  # type: ignore[arg-type]
        assert [e.arrival for e in batch] == sorted(e.arrival for e in batch)
        taken += [e.id for e in batch]
        queue = [e for e in queue if e not in batch]
    assert sorted(taken) == list(range(len(costs)))


@settings(max_examples=100, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from([1.0, 2.0, 3.0, 200.0])),
        min_size=5,
        max_size=60,
    ),
    size=st.integers(1, 6),
    max_wait=st.integers(0, 8),
)
def test_past_the_age_bound_no_item_is_passed_over_more_than_the_items_ahead_of_it(
    arrivals: list[tuple[int, float]], size: int, max_wait: int
) -> None:
    """However skewed the arrivals (a stream of cheap items while an expensive one
    waits), once an item has waited the age bound it goes in one of the next
    ``ahead + 1`` batches, ``ahead`` being the items queued before it when it came.
    Time moves one unit per batch."""
    composer = Composer(size, None, "padded", group=True, max_wait_s=float(max_wait))
    queue: list[Entry] = []
    ahead: dict[int, int] = {}
    passed_over: Counter[int] = Counter()
    now = 0
    for count, cost in [*arrivals, *[(0, 1.0)] * 400]:
        for _ in range(count):
            ahead[len(ahead)] = len(queue)
            queue.append(Entry(len(ahead) - 1, cost, float(now)))
        if not queue:
            continue
        batch = composer.choose(queue, now=float(now))
        queue = [e for e in queue if e not in batch]
        for entry in queue:
            if entry.arrival <= now - max_wait:
                passed_over[entry.id] += 1
                assert passed_over[entry.id] <= ahead[entry.id], "an item starves"
        now += 1
    assert not queue


class _Row(Pending):
    pass


def test_an_item_over_the_budget_is_refused_with_a_422() -> None:
    intake: Intake[_Row] = Intake(
        BatchConfig(cost_fn=len, max_batch_cost=10, max_batch_size=4), lambda: 0.0
    )
    assert intake.parts("abc")[0].cost == 3.0
    with pytest.raises(ItemTooLarge, match="cost 11 exceeds max_batch_cost=10") as raised:
        intake.parts("x" * 11)
    assert raised.value.http_status == 422


def test_an_item_of_rows_is_split_into_parts_within_the_budget() -> None:
    intake: Intake[_Row] = Intake(
        BatchConfig(cost_fn=len, max_batch_cost=12, max_batch_size=8, rows="list"),
        lambda: 0.0,
    )
    parts = intake.parts(["aaaa", "bb", "cccccc", "d"])  # padded: 4*2=8, then 6*2=12
    assert [part.item for part in parts] == [["aaaa", "bb"], ["cccccc", "d"]]
    assert [(part.cost, part.peak, part.rows) for part in parts] == [(6, 4, 2), (7, 6, 2)]
    with pytest.raises(ItemTooLarge, match="row 1 of cost 13"):
        intake.parts(["a", "x" * 13])


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"max_batch_cost": 10}, "max_batch_cost needs cost_fn"),
        ({"cost_fn": len, "max_batch_cost": 0}, "max_batch_cost must be None or a number > 0"),
        ({"cost_fn": len, "batch_cost": "max"}, "batch_cost must be 'padded' or 'sum'"),
        ({"group_window": 0}, "group_window must be an int >= 1"),
        ({"max_wait_ms": -1}, "max_wait_ms must be None or a finite number >= 0"),
        ({"oom_errors": (ValueError, 3)}, "oom_errors must be a tuple of exception types"),
        ({"cost_fn": 3}, "cost_fn must be callable"),
    ],
)
def test_composition_settings_are_validated(settings_: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchConfig(**settings_)  # type: ignore[arg-type]


def test_cost_fn_must_return_a_finite_number() -> None:
    intake: Intake[_Row] = Intake(BatchConfig(cost_fn=lambda item: item), lambda: 0.0)
    with pytest.raises(ValueError, match="cost_fn must return a finite number >= 0"):
        intake.parts(float("nan"))


def test_the_shape_cost_model_learns_items_and_cost_apart() -> None:
    model = ShapeCostModel(forgetting=1.0)
    shapes = [(items, cost) for items in (2, 8, 32) for cost in (64.0, 512.0, 4096.0)]
    for items, cost in shapes * 3:
        model.observe(items, cost, 0.002 + 0.0001 * items + 0.00001 * cost)
    assert model.predict(16, 1024.0) == pytest.approx(0.002 + 0.0016 + 0.01024)


def test_the_adaptive_policy_predicts_from_the_shape_of_the_queue() -> None:
    policy = AdaptivePolicy(64, 0.1, max_batch_cost=4096)
    for items, cost in [(4, 100.0), (8, 800.0), (16, 400.0), (32, 3200.0)] * 2:
        policy.batch_cost_finished(items, cost, cost, 0.0001 * items + 0.00002 * cost)
    short, long = QueueState(size=8, count=8, cost=80.0), QueueState(size=8, count=8, cost=800.0)
    assert policy._predict(long, 8) > 5 * policy._predict(short, 8)
    full = QueueState(size=3, count=3, cost=5000.0)
    assert policy.release_at(full, now=1.0) == 1.0 and policy.reason == "full"


def test_threads_share_budgets_grouping_and_out_of_memory_splits() -> None:
    seen: list[list[int]] = []
    lock = threading.Lock()

    def model(batch: list[int]) -> list[int]:
        with lock:
            seen.append(list(batch))
        if len(batch) > 1 and max(batch) * len(batch) > 60:
            raise MemoryError("too big")
        return [item + 1 for item in batch]

    costs = [1, 2, 30, 3, 25, 4, 5, 40, 6, 7] * 4
    with CooperativeBatcher(
        model,
        cost_fn=float,
        max_batch_cost=100,
        group_by_cost=True,
        max_batch_size=8,
        max_latency_ms=1,
    ) as batcher:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(batcher.submit, costs))
        stats = batcher.stats()
    assert results == [cost + 1 for cost in costs]
    assert all(max(batch) * len(batch) <= 100 for batch in seen if len(batch) > 1)
    assert stats.batch_cost_sum >= stats.useful_cost_sum > 0
    if stats.oom_splits:
        assert stats.cost_ceiling is not None
