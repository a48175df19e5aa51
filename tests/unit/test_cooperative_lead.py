"""The thread batcher's lead: whatever escapes a leader passes it on, and asyncio
callers share the queue with the threads (a pool thread leads in their place)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from microbatch import CooperativeBatcher, DeadlineExceeded, FixedPolicy, QueueState
from microbatch.errors import MicrobatchError
from microbatch.testing import FakeClock


class InterruptedOnce(FixedPolicy):
    """A fixed policy whose second question is interrupted (as by Ctrl-C)."""

    def __init__(self) -> None:
        super().__init__(max_batch_size=8, max_latency_s=10.0)
        self.asked = 0

    def release_at(self, state: QueueState, now: float) -> float:
        self.asked += 1
        if self.asked == 2:
            raise KeyboardInterrupt
        return super().release_at(state, now) if self.asked == 1 else now


def test_a_leader_interrupted_while_waiting_passes_the_lead_on() -> None:
    clock = FakeClock(100.0)
    computed: list[list[int]] = []

    def model(xs: list[int]) -> list[int]:
        computed.append(list(xs))
        return [x * 10 for x in xs]

    batcher = CooperativeBatcher(model, policy=InterruptedOnce, clock=clock)
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(batcher.submit, 1)
        clock.wait_for_timers(1)  # the leader waits for the policy's time
        follower = pool.submit(batcher.submit, 2)  # wakes it: interrupted
        assert isinstance(leader.exception(10), KeyboardInterrupt)
        assert follower.result(10) == 20  # the follower took the lead
        assert pool.submit(batcher.submit, 3).result(10) == 30  # and so do new callers
        pool.submit(batcher.close).result(10)  # close() returns
    assert computed == [[2], [3]]  # the interrupted caller's item was not computed
    assert batcher.stats().cancelled == 1


def test_a_model_interrupted_answers_its_batch_and_the_lead_goes_on() -> None:
    clock = FakeClock(100.0)

    def model(xs: list[int]) -> list[int]:
        if 1 in xs:
            raise KeyboardInterrupt
        return [x * 10 for x in xs]

    batcher = CooperativeBatcher(
        model, max_batch_size=2, max_latency_ms=10_000, policy="fixed", clock=clock
    )
    with ThreadPoolExecutor(3) as pool:
        leader = pool.submit(batcher.submit, 1)
        clock.wait_for_timers(1)
        follower = pool.submit(batcher.submit, 2)  # fills the batch
        assert isinstance(leader.exception(10), KeyboardInterrupt)
        assert isinstance(follower.exception(10), MicrobatchError)
        later = pool.submit(batcher.submit, 3)
        clock.wait_for_timers(1)
        clock.advance(10.0)
        assert later.result(10) == 30
        pool.submit(batcher.close).result(10)
    stats = batcher.stats()
    assert (stats.queued, stats.in_flight) == (0, 0)


async def test_asyncio_callers_and_threads_share_one_queue_and_one_set_of_counters() -> None:
    clock = FakeClock(100.0)
    batches: list[list[int]] = []

    def model(xs: list[int]) -> list[int]:
        batches.append(list(xs))
        return [x * 10 for x in xs]

    batcher = CooperativeBatcher(
        model, max_batch_size=2, max_latency_ms=10_000, policy="fixed", clock=clock
    )
    with ThreadPoolExecutor(1) as pool:
        thread_caller = pool.submit(batcher.submit, 1)
        await asyncio.to_thread(clock.wait_for_timers, 1)
        assert await batcher.asubmit(2) == 20  # fills the thread's batch
        assert thread_caller.result(10) == 10
    assert batches == [[1, 2]]
    stats = batcher.stats()
    assert (stats.batches, stats.items) == (1, 2)


async def test_asyncio_callers_alone_are_led_by_a_pool_thread() -> None:
    loop_thread = threading.get_ident()
    threads: set[int] = set()

    def model(xs: list[int]) -> list[int]:
        threads.add(threading.get_ident())
        return [x * 10 for x in xs]

    batcher = CooperativeBatcher(model, max_batch_size=4, max_latency_ms=1)
    results = await asyncio.wait_for(asyncio.gather(*(batcher.asubmit(x) for x in range(10))), 10)
    assert results == [x * 10 for x in range(10)]
    assert loop_thread not in threads  # the loop never ran the model
    await asyncio.to_thread(batcher.close)
    assert batcher.stats().items == 10


async def test_an_asyncio_callers_deadline_and_cancellation() -> None:
    clock = FakeClock(100.0)
    batcher = CooperativeBatcher(
        lambda xs: xs, max_batch_size=8, max_latency_ms=10_000, policy="fixed", clock=clock
    )
    expiring = asyncio.create_task(batcher.asubmit(1, timeout_s=1.0))
    cancelled = asyncio.create_task(batcher.asubmit(2))
    await asyncio.to_thread(clock.wait_for_timers, 2)  # the deadline, the policy's time
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await asyncio.to_thread(clock.advance, 1.0)
    with pytest.raises(DeadlineExceeded):
        await expiring
    stats = batcher.stats()
    assert (stats.expired, stats.cancelled, stats.queued, stats.batches) == (1, 1, 0, 0)
    await asyncio.wait_for(asyncio.to_thread(batcher.close), 10)
