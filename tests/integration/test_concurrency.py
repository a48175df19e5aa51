"""Many real concurrent callers (threads and asyncio tasks), with jitter and faults."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import pytest

import microbatch
from microbatch import CooperativeBatcher, DeadlineExceeded, Overloaded


class Poison(ValueError):
    pass


def jittery_model(batches: list[list[int]], limit: int):  # type: ignore[no-untyped-def]
    lock = threading.Lock()

    def model(xs: list[int]) -> list[int]:
        assert len(xs) <= limit, f"batch of {len(xs)} over the limit {limit}"
        with lock:
            batches.append(list(xs))
        time.sleep(random.random() * 0.002)
        if any(x % 97 == 13 for x in xs):
            raise Poison("poison")
        return [x * 2 for x in xs]

    return model


@pytest.mark.parametrize("policy", ["adaptive", "fixed"])
@pytest.mark.parametrize("max_concurrent_batches", [1, 3])
def test_forty_threads_with_jitter_each_get_their_own_answer(
    policy: str, max_concurrent_batches: int
) -> None:
    batches: list[list[int]] = []
    batcher = CooperativeBatcher(
        jittery_model(batches, 16),
        max_batch_size=16,
        max_latency_ms=2,
        policy=policy,  # type: ignore[arg-type]
        max_concurrent_batches=max_concurrent_batches,
    )
    outcomes: dict[int, object] = {}
    outcomes_lock = threading.Lock()
    threads_count, per_thread = 40, 60

    def caller(index: int) -> None:
        rng = random.Random(index)
        for j in range(per_thread):
            item = index * 1000 + j
            time.sleep(rng.random() * 0.0005)
            timeout = 0.001 if rng.random() < 0.05 else None
            try:
                result: object = batcher.submit(item, timeout_s=timeout)
            except (Poison, DeadlineExceeded) as exc:
                result = exc
            with outcomes_lock:
                assert item not in outcomes, "two outcomes for one call"
                outcomes[item] = result

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a caller hung"

    assert len(outcomes) == threads_count * per_thread
    computed = Counter(
        x for batch in batches for x in batch if not any(y % 97 == 13 for y in batch)
    )
    for item, outcome in outcomes.items():
        if isinstance(outcome, Poison):
            assert item % 97 == 13, f"{item} failed with a neighbour's poison"
        elif isinstance(outcome, DeadlineExceeded):
            pass
        else:
            assert outcome == item * 2, f"{item} got {outcome}"
            assert computed[item] == 1, f"{item} was computed {computed[item]} times"
    stats = batcher.stats()
    assert (stats.queued, stats.in_flight) == (0, 0)
    print(
        f"\n{threads_count} threads x {per_thread}: {stats.batches} batches, mean "
        f"{stats.mean_batch_size:.1f}, expired {stats.expired}, failed {stats.failed}"
    )


def test_threads_and_a_small_queue_see_overload_but_nothing_is_lost() -> None:
    batcher = CooperativeBatcher(
        lambda xs: (time.sleep(0.002), [x + 1 for x in xs])[1],
        max_batch_size=4,
        max_latency_ms=1,
        max_queue=4,
    )
    answered: list[object] = []
    lock = threading.Lock()

    def caller(index: int) -> None:
        for j in range(30):
            try:
                result: object = batcher.submit(index * 100 + j)
                assert result == index * 100 + j + 1
            except Overloaded as exc:
                result = exc
            with lock:
                answered.append(result)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answered) == 32 * 30
    overloaded = sum(isinstance(a, Overloaded) for a in answered)
    assert overloaded == batcher.stats().rejected > 0


async def test_many_asyncio_callers_with_cancellations_and_deadlines() -> None:
    random.seed(7)
    computed: Counter[int] = Counter()

    @microbatch.batch(max_batch_size=32, max_latency_ms=2)
    async def model(xs: list[int]) -> list[int]:
        computed.update(xs)
        await asyncio.sleep(random.random() * 0.002)
        return [x * 3 for x in xs]

    async def caller(item: int) -> object:
        await asyncio.sleep(random.random() * 0.01)
        try:
            return await model(item, timeout_s=0.002 if item % 11 == 0 else None)
        except DeadlineExceeded as exc:
            return exc

    tasks = [asyncio.create_task(caller(i)) for i in range(2000)]
    await asyncio.sleep(0.005)
    doomed = tasks[::13]
    for task in doomed:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for item, result in enumerate(results):
        if isinstance(result, asyncio.CancelledError):
            assert tasks[item] in doomed
        elif isinstance(result, DeadlineExceeded):
            assert item % 11 == 0
        else:
            assert result == item * 3
    assert all(count == 1 for count in computed.values())
    await model.close()
    stats = model.stats().stages[0].batching
    assert (stats.queued, stats.in_flight) == (0, 0)


async def test_sync_function_serves_threads_and_asyncio_together() -> None:
    @microbatch.batch(max_batch_size=16, max_latency_ms=1)
    def model(xs: list[int]) -> list[int]:
        time.sleep(0.001)
        return [x + 7 for x in xs]

    def thread_caller(base: int) -> list[int]:
        return [model(base + j) for j in range(20)]

    thread_results = [asyncio.to_thread(thread_caller, 10_000 * (i + 1)) for i in range(4)]
    async_results = [model.acall(i) for i in range(200)]
    by_threads = await asyncio.gather(*thread_results)
    assert await asyncio.gather(*async_results) == [i + 7 for i in range(200)]
    for i, values in enumerate(by_threads):
        assert values == [10_000 * (i + 1) + j + 7 for j in range(20)]


@pytest.mark.parametrize("max_concurrent_batches", [1, 2])
def test_saturated_thread_batcher_never_stalls(max_concurrent_batches: int) -> None:
    """Far more callers than one batch holds: full batches always wait, so callers that
    finish a batch run the next one for the leader. Nobody may be left asleep."""
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def model(xs: list[int]) -> list[int]:
        with lock:
            seen.update(xs)
        time.sleep(0.0005)
        return [x + 1 for x in xs]

    batcher = CooperativeBatcher(
        model, max_batch_size=8, max_latency_ms=5, max_concurrent_batches=max_concurrent_batches
    )
    results: dict[int, int] = {}

    def caller(index: int) -> None:
        for j in range(15):
            item = index * 100 + j
            results[item] = batcher.submit(item)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(128)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a caller was left waiting: the batcher stalled"
    assert len(results) == 128 * 15
    assert all(results[item] == item + 1 for item in results)
    assert all(count == 1 for count in seen.values())
    assert batcher.stats().mean_batch_size > 4
