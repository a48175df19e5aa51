"""The thread batcher: callers in plain threads, one of them runs each batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from microbatch import (
    BatcherClosed,
    CooperativeBatcher,
    DeadlineExceeded,
    ItemTooLarge,
    Overloaded,
    ResultLengthError,
)
from microbatch.testing import FakeClock


class GatedModel:
    """A model that blocks until ``gate`` is set, recording its batches and threads."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.batches: list[list[int]] = []
        self.threads: list[str] = []

    def __call__(self, xs: list[int]) -> list[int]:
        self.batches.append(list(xs))
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.gate.wait(10), "test gate never opened"
        return [x * 10 for x in xs]


def in_threads(fn: Callable[[int], object], items: list[int]) -> list[object]:
    def safe(item: int) -> object:
        try:
            return fn(item)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(safe, items))


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.001)


@dataclass
class Stuck:
    """A batcher whose first batch (item 0) is held in the model until ``release()``."""

    batcher: CooperativeBatcher[int, int]
    model: GatedModel
    pool: ThreadPoolExecutor
    running: Future[int]

    def queue(self, item: int, **kwargs: Any) -> Future[int]:
        """Submit ``item`` from another thread and wait until it is queued."""
        before = self.batcher.stats().queued
        future = self.pool.submit(self.batcher.submit, item, **kwargs)
        wait_until(lambda: self.batcher.stats().queued > before)
        return future

    def release(self) -> None:
        self.model.gate.set()


@contextmanager
def stuck(**settings: Any) -> Iterator[Stuck]:
    model = GatedModel()
    batcher: CooperativeBatcher[int, int] = CooperativeBatcher(
        model, max_latency_ms=0, **{"max_batch_size": 8, **settings}
    )
    with ThreadPoolExecutor(16) as pool:
        running = pool.submit(batcher.submit, 0)
        assert model.started.wait(10)
        try:
            yield Stuck(batcher, model, pool, running)
        finally:
            model.gate.set()


def test_a_single_caller_runs_its_own_batch() -> None:
    batcher = CooperativeBatcher(lambda xs: [x + 1 for x in xs], max_batch_size=8)
    assert batcher.submit(41) == 42
    assert batcher.stats().batches == 1


def test_followers_queue_while_the_leader_runs_and_form_the_next_batch() -> None:
    with stuck(max_batch_size=64) as held:
        rest = [held.queue(i) for i in range(1, 8)]
        held.release()
        assert held.running.result(10) == 0
        assert [f.result(10) for f in rest] == [i * 10 for i in range(1, 8)]
    assert held.model.batches == [[0], list(range(1, 8))]


def test_the_batch_runs_in_a_callers_thread() -> None:
    names: list[str] = []

    def model(xs: list[int]) -> list[int]:
        names.append(threading.current_thread().name)
        return xs

    batcher = CooperativeBatcher(model, max_batch_size=8)
    batcher.submit(1)
    assert names == [threading.current_thread().name]


def test_per_item_errors_and_poison_isolation() -> None:
    def model(xs: list[int]) -> list[object]:
        if 5 in xs:
            raise ValueError("5 is poison")
        return [KeyError(x) if x == 3 else x for x in xs]

    batcher = CooperativeBatcher(model, max_batch_size=16, max_latency_ms=5)
    results = in_threads(batcher.submit, list(range(12)))
    for i, result in enumerate(results):
        if i == 5:
            assert isinstance(result, ValueError)
        elif i == 3:
            assert isinstance(result, KeyError)
        else:
            assert result == i


def test_wrong_result_length() -> None:
    batcher = CooperativeBatcher(lambda xs: [], max_batch_size=4)
    with pytest.raises(ResultLengthError):
        batcher.submit(1)


def test_deadline_of_a_queued_follower() -> None:
    clock = FakeClock(100.0)
    with stuck(clock=clock) as held:
        follower = held.pool.submit(held.batcher.submit, 1, timeout_s=0.02)
        clock.wait_for_timers(1)  # asleep until its deadline
        clock.advance(0.02)
        with pytest.raises(DeadlineExceeded):
            follower.result(10)
        held.release()
        assert held.running.result(10) == 0
    assert held.model.batches == [[0]]  # the expired item was never computed
    assert held.batcher.stats().expired == 1


def test_deadline_of_a_leader_waiting_for_a_slot_passes_the_lead_on() -> None:
    clock = FakeClock(100.0)
    with stuck(clock=clock) as held:
        impatient = held.pool.submit(held.batcher.submit, 1, timeout_s=0.05)  # leads next
        clock.wait_for_timers(1)
        patient = held.pool.submit(held.batcher.submit, 2, timeout_s=60.0)
        clock.wait_for_timers(2)
        clock.advance(0.05)
        with pytest.raises(DeadlineExceeded):
            impatient.result(10)
        held.release()
        assert held.running.result(10) == 0
        assert patient.result(10) == 20
    assert held.model.batches == [[0], [2]]


def test_deadline_of_a_follower_in_a_running_batch_answers_on_time() -> None:
    clock = FakeClock(100.0)
    model = GatedModel()
    batcher = CooperativeBatcher(
        model, max_batch_size=2, max_latency_ms=10_000, policy="fixed", clock=clock
    )
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(batcher.submit, 0)
        clock.wait_for_timers(1)  # the leader waits for the policy's time
        follower = pool.submit(batcher.submit, 1, timeout_s=0.05)  # fills the batch
        assert model.started.wait(10)
        clock.wait_for_timers(1)  # the follower waits for its deadline
        clock.advance(0.05)
        with pytest.raises(DeadlineExceeded):
            follower.result(10)  # answered while its batch still runs
        assert model.batches == [[0, 1]]
        model.gate.set()
        assert leader.result(10) == 0


def test_the_policy_time_is_fake_time() -> None:
    clock = FakeClock(100.0)
    batcher = CooperativeBatcher(
        lambda xs: xs, max_batch_size=8, max_latency_ms=10, policy="fixed", clock=clock
    )
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(batcher.submit, 7)
        clock.wait_for_timers(1)
        assert clock.next_timer() == pytest.approx(100.01)
        clock.advance(0.009)
        assert not waiting.done() and batcher.stats().queued == 1
        clock.advance(0.001)
        assert waiting.result(10) == 7
    assert batcher.stats().queue_wait_p50_ms == pytest.approx(10.0)


def test_full_queue_answers_overloaded_at_once() -> None:
    with stuck(max_batch_size=1, max_queue=1) as held:
        queued = held.queue(1)
        with pytest.raises(Overloaded):
            held.batcher.submit(2)
        held.release()
        assert (held.running.result(10), queued.result(10)) == (0, 10)


def test_calling_the_batcher_from_its_own_batch_function_is_an_error() -> None:
    batcher: CooperativeBatcher[int, int]

    def model(xs: list[int]) -> list[int]:
        return [batcher.submit(x) for x in xs]

    batcher = CooperativeBatcher(model, max_batch_size=2)
    with pytest.raises(RuntimeError, match="deadlock"):
        batcher.submit(1)


def test_rows_and_oversized_items() -> None:
    batcher = CooperativeBatcher(
        lambda rows: [r * 2 for r in rows], max_batch_size=3, max_latency_ms=1, rows="list"
    )
    assert batcher.submit(list(range(8))) == [r * 2 for r in range(8)]
    assert batcher.stats().batches == 3
    sized = CooperativeBatcher(lambda xs: xs, max_batch_size=3, size_fn=len)
    with pytest.raises(ItemTooLarge):
        sized.submit("four")


def test_close_drains_and_refuses_new_items() -> None:
    with stuck() as held:
        queued = held.queue(1)
        closing = held.pool.submit(held.batcher.close)
        held.release()
        closing.result(10)
        assert (held.running.result(10), queued.result(10)) == (0, 10)
    with pytest.raises(BatcherClosed):
        held.batcher.submit(3)


def test_close_without_drain_answers_the_queue() -> None:
    with stuck() as held:
        queued = held.queue(1)
        closing = held.pool.submit(held.batcher.close, drain=False)
        with pytest.raises(BatcherClosed):
            queued.result(10)
        held.release()
        closing.result(10)
        assert held.running.result(10) == 0
    assert held.model.batches == [[0]]


def test_a_model_that_raises_a_base_exception_releases_everyone() -> None:
    class Stop(BaseException):
        pass

    def model(xs: list[int]) -> list[int]:
        raise Stop

    batcher = CooperativeBatcher(model, max_batch_size=8)
    with pytest.raises(Stop):
        batcher.submit(1)
    assert batcher.stats().in_flight == 0
    batcher2 = CooperativeBatcher(lambda xs: xs, max_batch_size=8)
    assert batcher2.submit(2) == 2
