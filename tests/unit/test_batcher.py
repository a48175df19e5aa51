"""The asyncio batcher, driven by a FakeClock: every timing decision is exact."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from microbatch import (
    Batcher,
    BatcherClosed,
    DeadlineExceeded,
    FixedPolicy,
    ItemTooLarge,
    MicrobatchError,
    Overloaded,
    ResultLengthError,
)
from microbatch.stats import QUEUE_WAIT_BUCKETS_S
from microbatch.testing import FakeClock
from tests.conftest import settle


class Model:
    """An async model that records its batches and takes ``cost_s`` of fake time."""

    def __init__(self, clock: FakeClock, cost_s: float = 0.0) -> None:
        self.clock = clock
        self.cost_s = cost_s
        self.batches: list[list[int]] = []

    async def __call__(self, xs: list[int]) -> list[int]:
        self.batches.append(list(xs))
        if self.cost_s:
            await self.clock.sleep(self.cost_s)
        return [x * 10 for x in xs]

    @property
    def computed(self) -> list[int]:
        return [x for batch in self.batches for x in batch]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=100.0)


async def test_fixed_policy_releases_at_max_latency(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=10, policy="fixed")
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
    await settle()
    clock.advance(0.0099)
    await settle()
    assert model.batches == []
    clock.advance(0.0001)
    await settle()
    assert model.batches == [[0, 1, 2]]
    assert [await c for c in calls] == [0, 10, 20]


async def test_full_batch_goes_at_once(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(model, clock=clock, max_batch_size=4, max_latency_ms=10, policy="fixed")
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(6)]
    await settle()
    assert model.batches == [[0, 1, 2, 3]]
    clock.advance(0.010)
    await settle()
    assert model.batches == [[0, 1, 2, 3], [4, 5]]
    assert await asyncio.gather(*calls) == [0, 10, 20, 30, 40, 50]


async def test_batches_grow_while_the_slot_is_busy(clock: FakeClock) -> None:
    model = Model(clock, cost_s=0.005)
    batcher = Batcher(model, clock=clock, max_batch_size=64, max_latency_ms=0)
    first = asyncio.create_task(batcher.submit(0))
    await settle()
    rest = [asyncio.create_task(batcher.submit(i)) for i in range(1, 10)]
    await settle()
    assert model.batches == [[0]]
    assert batcher.stats().queued == 9
    clock.advance(0.005)
    await settle()
    assert model.batches == [[0], list(range(1, 10))]
    clock.advance(0.005)
    await settle()
    assert await first == 0
    assert await asyncio.gather(*rest) == [i * 10 for i in range(1, 10)]


async def test_concurrent_batches_are_limited(clock: FakeClock) -> None:
    model = Model(clock, cost_s=0.005)
    batcher = Batcher(
        model,
        clock=clock,
        max_batch_size=2,
        max_latency_ms=1,
        policy="fixed",
        max_concurrent_batches=2,
    )
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(8)]
    await settle()
    assert model.batches == [[0, 1], [2, 3]]
    assert batcher.stats().in_flight == 4
    clock.advance(0.005)
    await settle()
    assert len(model.batches) == 4
    clock.advance(0.005)
    await settle()
    assert await asyncio.gather(*calls) == [i * 10 for i in range(8)]


async def test_deadline_in_queue_answers_at_the_deadline_and_never_computes(
    clock: FakeClock,
) -> None:
    model = Model(clock, cost_s=0.050)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=0)
    blocker = asyncio.create_task(batcher.submit(0))
    await settle()
    late = asyncio.create_task(batcher.submit(1, timeout_s=0.010))
    await settle()
    clock.advance(0.0099)
    await settle()
    assert not late.done()
    clock.advance(0.0001)
    await settle()
    with pytest.raises(DeadlineExceeded):
        await late
    clock.advance(0.050)
    await settle()
    assert await blocker == 0
    assert model.computed == [0]
    stats = batcher.stats()
    assert (stats.expired, stats.queued, stats.in_flight) == (1, 0, 0)


async def test_deadline_while_running_answers_on_time(clock: FakeClock) -> None:
    model = Model(clock, cost_s=0.050)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=0)
    call = asyncio.create_task(batcher.submit(7, deadline=clock.now() + 0.020))
    await settle()
    clock.advance(0.020)
    await settle()
    with pytest.raises(DeadlineExceeded):
        await call
    clock.advance(0.030)
    await settle()
    assert model.computed == [7]  # it had started: its late result is dropped
    assert batcher.stats().in_flight == 0


async def test_passed_deadline_is_refused_without_queueing(clock: FakeClock) -> None:
    batcher = Batcher(Model(clock), clock=clock)
    with pytest.raises(DeadlineExceeded):
        await batcher.submit(1, deadline=clock.now())
    assert batcher.stats().queued == 0


async def test_full_queue_answers_overloaded_at_once(clock: FakeClock) -> None:
    model = Model(clock, cost_s=1.0)
    batcher = Batcher(model, clock=clock, max_batch_size=1, max_latency_ms=0, max_queue=2)
    running = asyncio.create_task(batcher.submit(0))
    await settle()
    queued = [asyncio.create_task(batcher.submit(i)) for i in (1, 2)]
    await settle()
    with pytest.raises(Overloaded):
        await batcher.submit(3)
    assert batcher.stats().rejected == 1
    for _ in range(3):
        clock.advance(1.0)
        await settle()
    assert [await running, *[await q for q in queued]] == [0, 10, 20]
    assert 3 not in model.computed


async def test_cancelled_caller_is_removed_and_never_computed(clock: FakeClock) -> None:
    model = Model(clock, cost_s=0.010)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=0)
    first = asyncio.create_task(batcher.submit(0))
    await settle()
    doomed = asyncio.create_task(batcher.submit(1))
    kept = asyncio.create_task(batcher.submit(2))
    await settle()
    doomed.cancel()
    await settle()
    assert batcher.stats().queued == 1
    clock.advance(0.010)
    await settle()
    clock.advance(0.010)
    await settle()
    assert (await first, await kept) == (0, 20)
    assert doomed.cancelled()
    assert 1 not in model.computed
    assert batcher.stats().cancelled == 1


async def test_wait_for_timeout_cancels_cleanly(clock: FakeClock) -> None:
    gate = asyncio.Event()

    async def model(xs: list[int]) -> list[int]:
        await gate.wait()
        return xs

    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=0)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(batcher.submit(1), timeout=0.01)
    gate.set()
    await settle()
    assert batcher.stats().in_flight == 0


async def test_per_item_errors_and_poison_isolation(clock: FakeClock) -> None:
    async def model(xs: list[int]) -> list[object]:
        if 13 in xs:
            raise ValueError("13 is poison")
        return [KeyError(x) if x == 7 else x for x in xs]

    batcher = Batcher(model, clock=clock, max_batch_size=32, max_latency_ms=0)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(20)), return_exceptions=True)
    for i, result in enumerate(results):
        if i == 13:
            assert isinstance(result, ValueError) and "poison" in str(result)
        elif i == 7:
            assert isinstance(result, KeyError)
        else:
            assert result == i
    assert batcher.stats().failed == 2


async def test_wrong_result_length_is_a_clear_error_for_each_item(clock: FakeClock) -> None:
    async def model(xs: list[int]) -> list[int]:
        return xs[:-1]

    batcher = Batcher(model, clock=clock, max_batch_size=4, max_latency_ms=0, policy="fixed")
    results = await asyncio.gather(*(batcher.submit(i) for i in range(4)), return_exceptions=True)
    assert all(isinstance(r, ResultLengthError) for r in results)


async def test_size_fn_counts_units_and_refuses_oversized_items(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(
        model, clock=clock, max_batch_size=10, max_latency_ms=5, policy="fixed", size_fn=lambda x: x
    )
    calls = [asyncio.create_task(batcher.submit(x)) for x in (4, 5, 3, 2)]
    await settle()
    assert model.batches == [[4, 5]]  # 14 units queued: a full batch; 3 more would not fit
    clock.advance(0.005)
    await settle()
    assert model.batches == [[4, 5], [3, 2]]
    assert await asyncio.gather(*calls) == [40, 50, 30, 20]
    with pytest.raises(ItemTooLarge):
        await batcher.submit(11)


async def test_rows_are_merged_and_large_items_split(clock: FakeClock) -> None:
    seen: list[list[int]] = []

    async def model(rows: list[int]) -> list[int]:
        seen.append(list(rows))
        return [r + 1000 for r in rows]

    batcher = Batcher(model, clock=clock, max_batch_size=4, max_latency_ms=0, rows="list")
    small = asyncio.create_task(batcher.submit([1, 2]))
    big = asyncio.create_task(batcher.submit(list(range(10, 20))))
    await settle(50)
    assert await small == [1001, 1002]
    assert await big == [r + 1000 for r in range(10, 20)]
    assert all(len(batch) <= 4 for batch in seen)
    assert sorted(r for batch in seen for r in batch) == [1, 2, *range(10, 20)]


async def test_sync_function_runs_off_the_event_loop() -> None:
    threads: set[str] = set()

    def model(xs: list[int]) -> list[int]:
        threads.add(threading.current_thread().name)
        return [x + 1 for x in xs]

    async with Batcher(model, max_batch_size=8, max_latency_ms=1) as batcher:
        assert await asyncio.gather(*(batcher.submit(i) for i in range(20))) == list(range(1, 21))
    assert threading.current_thread().name not in threads


async def test_close_drains_queued_items(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=1000, policy="fixed")
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
    await settle()
    await batcher.close()
    assert await asyncio.gather(*calls) == [0, 10, 20]
    with pytest.raises(BatcherClosed):
        await batcher.submit(4)


async def test_close_without_drain_answers_queued_items(clock: FakeClock) -> None:
    model = Model(clock, cost_s=0.010)
    batcher = Batcher(model, clock=clock, max_batch_size=1, max_latency_ms=0)
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
    await settle()
    closing = asyncio.create_task(batcher.close(drain=False))
    await settle()
    clock.advance(0.010)
    await settle()
    await closing
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert results[0] == 0
    assert all(isinstance(r, BatcherClosed) for r in results[1:])
    assert model.computed == [0]


async def test_an_aborted_batch_fails_its_items_instead_of_hanging(clock: FakeClock) -> None:
    async def model(xs: list[int]) -> list[int]:
        raise asyncio.CancelledError  # e.g. the task running the batch was cancelled

    batcher = Batcher(model, clock=clock, max_batch_size=4, max_latency_ms=0)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, MicrobatchError) for r in results)
    assert batcher.stats().in_flight == 0


async def test_stats_report_batches_and_waits(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(model, clock=clock, max_batch_size=2, max_latency_ms=4, policy="fixed")
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
    await settle()
    clock.advance(0.004)
    await settle()
    await asyncio.gather(*calls)
    stats = batcher.stats()
    assert (stats.batches, stats.items, stats.mean_batch_size) == (2, 3, 1.5)
    assert dict(stats.batch_sizes) == {1: 1, 2: 1}
    assert stats.queue_wait_p99_ms == pytest.approx(4.0)
    assert stats.queue_wait_p50_ms == pytest.approx(0.0)
    # waits 0, 0 and 4 ms: two in the first bucket, one in the 5 ms bucket
    counts = dict(zip((*QUEUE_WAIT_BUCKETS_S, "inf"), stats.queue_wait_counts, strict=True))
    assert (counts[0.0001], counts[0.005], sum(counts.values())) == (2, 1, 3)
    assert stats.queue_wait_sum_s == pytest.approx(0.004)


def test_a_batcher_belongs_to_one_live_event_loop() -> None:
    batcher = Batcher(lambda xs: xs, max_batch_size=2, max_latency_ms=0)
    first = asyncio.new_event_loop()
    assert first.run_until_complete(batcher.submit(1)) == 1
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(batcher.submit(2))
    first.close()
    del first
    gc.collect()
    assert asyncio.run(batcher.submit(3)) == 3  # the first loop is gone: a new one takes over


def test_config_and_settings_are_exclusive() -> None:
    from microbatch import BatchConfig

    with pytest.raises(TypeError):
        Batcher(lambda xs: xs, BatchConfig(), max_batch_size=3)


async def test_a_sync_function_that_raises_a_base_exception_fails_its_batch_only() -> None:
    class Stop(BaseException):
        pass

    def model(xs: list[int]) -> list[int]:
        if 0 in xs:
            raise Stop
        return xs

    async with Batcher(model, max_batch_size=4, max_latency_ms=0) as batcher:
        with pytest.raises(MicrobatchError, match="aborted"):
            await batcher.submit(0)
        assert await batcher.submit(5) == 5  # the slot was freed


async def test_adaptive_policy_never_waits_for_a_lone_sequential_caller(clock: FakeClock) -> None:
    model = Model(clock, cost_s=0.002)
    batcher = Batcher(model, clock=clock, max_batch_size=64, max_latency_ms=10)
    for i in range(20):
        call = asyncio.create_task(batcher.submit(i))
        await settle()
        assert model.batches[-1] == [i], "the item waited for company that never comes"
        clock.advance(0.002)  # only the model's own time passes
        await settle()
        assert await call == i * 10
    assert batcher.stats().queue_wait_p99_ms == 0.0


async def test_submit_nowait_returns_the_result_future(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=10, policy="fixed")
    assert batcher.accepts_nowait
    futures = [batcher.submit_nowait(i, deadline=clock.now() + 1.0) for i in range(3)]
    assert isinstance(futures[0], asyncio.Future)
    clock.advance(0.010)
    await settle()
    assert model.batches == [[0, 1, 2]]
    assert [f.result() for f in futures] == [0, 10, 20]


async def test_submit_nowait_cancelled_future_withdraws_the_item(clock: FakeClock) -> None:
    model = Model(clock, cost_s=0.010)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=0)
    first = batcher.submit_nowait(0)
    await settle()
    doomed = batcher.submit_nowait(1)
    kept = batcher.submit_nowait(2)
    doomed.cancel()
    await settle()
    assert batcher.stats().queued == 1
    clock.advance(0.010)
    await settle()
    clock.advance(0.010)
    await settle()
    assert (first.result(), kept.result()) == (0, 20)
    assert 1 not in model.computed
    assert batcher.stats().cancelled == 1


async def test_submit_nowait_refuses_at_once(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(
        model, clock=clock, max_batch_size=8, max_latency_ms=10, max_queue=1, policy="fixed"
    )
    with pytest.raises(DeadlineExceeded):
        batcher.submit_nowait(0, deadline=clock.now())
    assert batcher.stats().expired == 1
    batcher.submit_nowait(1)
    with pytest.raises(Overloaded):
        batcher.submit_nowait(2)
    sized = Batcher(model, clock=clock, max_batch_size=8, size_fn=lambda _: 1)
    assert not sized.accepts_nowait
    with pytest.raises(TypeError):
        sized.submit_nowait(0)
    await batcher.close()


async def test_items_arriving_together_behind_a_running_batch_form_one_batch(
    clock: FakeClock,
) -> None:
    model = Model(clock, cost_s=0.010)
    # run_ahead: a batch may be handed over to wait behind the running one
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=0, run_ahead=True)
    first = asyncio.create_task(batcher.submit(0))
    await settle()
    assert model.batches == [[0]]  # the slot was idle: it went at once
    # Three callers in the same round of the loop, while the first batch runs: the
    # policy is asked once for them all (not once per arrival), so they go together.
    later = [asyncio.create_task(batcher.submit(i)) for i in (1, 2, 3)]
    await settle()
    clock.advance(0.010)
    await settle()
    clock.advance(0.010)
    await settle()
    assert model.batches == [[0], [1, 2, 3]]
    assert (await first, [await c for c in later]) == (0, [10, 20, 30])


async def test_items_arriving_together_at_an_idle_slot_form_one_batch(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=10)
    # Four callers in the same round of the loop while nothing runs: the policy is
    # asked once the round is in, so they go as one batch (not the first alone).
    callers = [asyncio.create_task(batcher.submit(i)) for i in range(4)]
    await settle()
    assert model.batches == [[0, 1, 2, 3]]
    assert [await c for c in callers] == [0, 10, 20, 30]
    await batcher.close()


async def test_a_lone_caller_at_an_idle_slot_goes_without_waiting(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(model, clock=clock, max_batch_size=8, max_latency_ms=10)
    for i in range(3):  # one caller at a time: no fake time passes, yet every one runs
        assert await asyncio.wait_for(batcher.submit(i), 1.0) == 10 * i
    assert model.batches == [[0], [1], [2]]
    await batcher.close()


class _HalvingPolicy(FixedPolicy):
    """The fixed policy, with a cap on each batch (as AdaptivePolicy.batch_limit)."""

    batch_limit = 2

    def __init__(self) -> None:
        super().__init__(max_batch_size=4, max_latency_s=0.010)


async def test_a_batch_takes_no_more_than_the_policys_batch_limit(clock: FakeClock) -> None:
    model = Model(clock)
    batcher = Batcher(
        model, clock=clock, max_batch_size=4, max_latency_ms=10, policy=_HalvingPolicy()
    )
    calls = [asyncio.create_task(batcher.submit(i)) for i in range(4)]
    await settle()  # full (4 queued): the first two go at once
    assert model.batches == [[0, 1]]
    clock.advance(0.010)  # the other two at the fixed policy's latency bound
    await settle()
    assert model.batches == [[0, 1], [2, 3]]
    assert await asyncio.gather(*calls) == [0, 10, 20, 30]
