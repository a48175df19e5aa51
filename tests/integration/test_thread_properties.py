"""Property-based schedules for the thread batcher, with real threads and real time.

Timing is not controlled here (threads never are), so each example checks only what
must hold whatever the interleaving: one outcome per call and its own, poison and
deadlines failing only their own items, no batch over its limit, nothing computed
twice, and no caller left waiting. Some examples put part of the callers in an
event loop (``asubmit``), in the same queue as the threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch import CooperativeBatcher, DeadlineExceeded


class Poison(ValueError):
    pass


@dataclass(frozen=True)
class Call:
    poison: bool
    timeout_s: float | None
    pause_s: float


calls = st.builds(
    Call,
    poison=st.sampled_from([False] * 9 + [True]),
    timeout_s=st.none() | st.sampled_from([0.0005, 0.002, 0.05]),
    pause_s=st.sampled_from([0.0, 0.0, 0.0002, 0.001]),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schedules=st.lists(st.lists(calls, min_size=1, max_size=12), min_size=2, max_size=24),
    max_batch_size=st.integers(2, 8),
    max_latency_ms=st.sampled_from([0.0, 1.0, 3.0]),
    policy=st.sampled_from(["adaptive", "fixed"]),
    max_concurrent_batches=st.integers(1, 2),
    cost_s=st.sampled_from([0.0, 0.0005]),
    in_a_loop=st.booleans(),
)
def test_threads_get_exactly_their_own_outcomes(
    schedules: list[list[Call]],
    max_batch_size: int,
    max_latency_ms: float,
    policy: str,
    max_concurrent_batches: int,
    cost_s: float,
    in_a_loop: bool,
) -> None:
    computed: Counter[int] = Counter()
    oversized: list[list[int]] = []
    poison_ids = {
        t * 100 + j for t, calls in enumerate(schedules) for j, c in enumerate(calls) if c.poison
    }
    lock = threading.Lock()

    def model(ids: list[int]) -> list[int]:
        if len(ids) > max_batch_size:
            oversized.append(ids)
        if cost_s:
            time.sleep(cost_s)
        if poison_ids & set(ids):
            raise Poison("poison in batch")
        with lock:
            computed.update(ids)
        return [i * 7 for i in ids]

    batcher = CooperativeBatcher(
        model,
        max_batch_size=max_batch_size,
        max_latency_ms=max_latency_ms,
        policy=policy,  # type: ignore[arg-type]
        max_concurrent_batches=max_concurrent_batches,
    )
    outcomes: dict[int, object] = {}

    def caller(thread: int, plan: list[Call]) -> None:
        for j, call in enumerate(plan):
            time.sleep(call.pause_s)
            item = thread * 100 + j
            try:
                outcome: object = batcher.submit(item, timeout_s=call.timeout_s)
            except (Poison, DeadlineExceeded) as exc:
                outcome = exc
            record(item, outcome)

    def record(item: int, outcome: object) -> None:
        with lock:
            assert item not in outcomes, "two outcomes for one call"
            outcomes[item] = outcome

    async def loop_caller(thread: int, plan: list[Call]) -> None:
        for j, call in enumerate(plan):
            await asyncio.sleep(call.pause_s)
            item = thread * 100 + j
            try:
                outcome: object = await batcher.asubmit(item, timeout_s=call.timeout_s)
            except (Poison, DeadlineExceeded) as exc:
                outcome = exc
            record(item, outcome)

    async def loop_callers(plans: list[tuple[int, list[Call]]]) -> None:
        await asyncio.gather(*(loop_caller(t, plan) for t, plan in plans))

    plans = list(enumerate(schedules))
    in_loop = plans[::2] if in_a_loop else []
    threads = [threading.Thread(target=caller, args=plan) for plan in plans if plan not in in_loop]
    if in_loop:
        threads.append(threading.Thread(target=asyncio.run, args=(loop_callers(in_loop),)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a caller was left waiting"

    assert not oversized, oversized
    for t, plan in enumerate(schedules):
        for j, call in enumerate(plan):
            item, outcome = t * 100 + j, outcomes[t * 100 + j]
            if isinstance(outcome, Poison):
                assert call.poison, f"{item} failed with a neighbour's poison"
            elif isinstance(outcome, DeadlineExceeded):
                assert call.timeout_s is not None
            else:
                assert outcome == item * 7, f"{item} got {outcome!r}"
                assert not call.poison
    # A caller whose deadline passed is answered while its batch may still run (the
    # model finishes it for nobody): let the batcher go idle before reading its counts.
    closing = threading.Thread(target=batcher.close)
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), "the batcher never went idle"
    assert all(count == 1 for count in computed.values()), "an item was computed twice"
    stats = batcher.stats()
    assert (stats.queued, stats.in_flight) == (0, 0)
