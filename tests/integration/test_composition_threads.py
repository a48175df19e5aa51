"""Batch composition in the thread batcher: random costs from many threads, with a
budget, grouping and a model that runs out of memory above a hidden cost. Every
item is answered exactly once with its own result (or its own MemoryError), and no
batch exceeds its budget. No timing is asserted."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch import CooperativeBatcher


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    costs=st.lists(st.sampled_from([1, 2, 4, 8, 16, 64]), min_size=1, max_size=80),
    budget=st.sampled_from([64.0, 256.0]),
    group=st.booleans(),
    hidden=st.sampled_from([None, 20, 100]),
    threads=st.integers(1, 12),
)
def test_threads_get_their_own_results_within_the_budget(
    costs: list[int], budget: float, group: bool, hidden: int | None, threads: int
) -> None:
    lock = threading.Lock()
    computed: Counter[int] = Counter()
    over: list[list[tuple[int, int]]] = []

    def model(batch: list[tuple[int, int]]) -> list[int]:
        padded = max(cost for _, cost in batch) * len(batch)
        with lock:
            if len(batch) > 1 and padded > budget:
                over.append(batch)
        if hidden is not None and len(batch) > 1 and padded > hidden:
            raise MemoryError(f"{padded} > {hidden}")
        with lock:
            computed.update(index for index, _ in batch)
        return [index * 10 for index, _ in batch]

    def call(index: int) -> object:
        try:
            return batcher.submit((index, costs[index]))
        except MemoryError as error:
            return error

    with (
        CooperativeBatcher(
            model,
            cost_fn=lambda item: item[1],
            max_batch_cost=budget,
            group_by_cost=group,
            max_batch_size=16,
            max_latency_ms=1,
        ) as batcher,
        ThreadPoolExecutor(threads) as pool,
    ):
        outcomes = list(pool.map(call, range(len(costs))))
    assert not over, over
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, MemoryError):
            raise AssertionError(f"item {index} of cost {costs[index]} failed: {outcome}")
        assert outcome == index * 10
    assert all(count == 1 for count in computed.values()), "an item computed twice"
    assert sorted(computed) == list(range(len(costs)))
