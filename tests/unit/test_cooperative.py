"""The thread batcher: callers in plain threads, one of them runs each batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from microbatch import (
    BatcherClosed,
    CooperativeBatcher,
    DeadlineExceeded,
    ItemTooLarge,
    Overloaded,
    ResultLengthError,
)


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


def test_a_single_caller_runs_its_own_batch() -> None:
    batcher = CooperativeBatcher(lambda xs: [x + 1 for x in xs], max_batch_size=8)
    assert batcher.submit(41) == 42
    assert batcher.stats().batches == 1


def test_followers_queue_while_the_leader_runs_and_form_the_next_batch() -> None:
    model = GatedModel()
    batcher = CooperativeBatcher(model, max_batch_size=64, max_latency_ms=0)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(batcher.submit, 0)
        assert model.started.wait(10)
        rest = [pool.submit(batcher.submit, i) for i in range(1, 8)]
        wait_until(lambda: batcher.stats().queued == 7)
        model.gate.set()
        assert first.result(10) == 0
        assert [f.result(10) for f in rest] == [i * 10 for i in range(1, 8)]
    assert model.batches == [[0], list(range(1, 8))]
    assert set(model.threads) <= {t.name for t in threading.enumerate()} | set(model.threads)


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
    model = GatedModel()
    batcher = CooperativeBatcher(model, max_batch_size=8, max_latency_ms=0)
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(batcher.submit, 0)
        assert model.started.wait(10)
        with pytest.raises(DeadlineExceeded):
            batcher.submit(1, timeout_s=0.02)
        model.gate.set()
        assert leader.result(10) == 0
    assert model.batches == [[0]]  # the expired item was never computed
    assert batcher.stats().expired == 1


def test_deadline_of_a_leader_waiting_for_a_slot_passes_the_lead_on() -> None:
    model = GatedModel()
    batcher = CooperativeBatcher(model, max_batch_size=8, max_latency_ms=0)
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(batcher.submit, 0)
        assert model.started.wait(10)
        impatient = pool.submit(batcher.submit, 1, timeout_s=0.02)  # leads the next batch
        wait_until(lambda: batcher.stats().queued == 1)
        patient = pool.submit(batcher.submit, 2)
        with pytest.raises(DeadlineExceeded):
            impatient.result(10)
        model.gate.set()
        assert running.result(10) == 0
        assert patient.result(10) == 20
    assert model.batches == [[0], [2]]


def test_deadline_of_a_follower_in_a_running_batch_answers_on_time() -> None:
    model = GatedModel()
    batcher = CooperativeBatcher(model, max_batch_size=2, max_latency_ms=10_000, policy="fixed")
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(batcher.submit, 0)
        wait_until(lambda: batcher.stats().queued == 1)
        with pytest.raises(DeadlineExceeded):
            batcher.submit(1, timeout_s=0.05)  # fills the batch, then times out in it
        assert model.batches == [[0, 1]]
        model.gate.set()
        assert leader.result(10) == 0


def test_full_queue_answers_overloaded_at_once() -> None:
    model = GatedModel()
    batcher = CooperativeBatcher(model, max_batch_size=1, max_latency_ms=0, max_queue=1)
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(batcher.submit, 0)
        assert model.started.wait(10)
        queued = pool.submit(batcher.submit, 1)
        wait_until(lambda: batcher.stats().queued == 1)
        with pytest.raises(Overloaded):
            batcher.submit(2)
        model.gate.set()
        assert (running.result(10), queued.result(10)) == (0, 10)


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
    model = GatedModel()
    batcher = CooperativeBatcher(model, max_batch_size=8, max_latency_ms=0)
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(batcher.submit, 0)
        assert model.started.wait(10)
        queued = pool.submit(batcher.submit, 1)
        wait_until(lambda: batcher.stats().queued == 1)
        closing = pool.submit(batcher.close)
        model.gate.set()
        closing.result(10)
        assert (running.result(10), queued.result(10)) == (0, 10)
    with pytest.raises(BatcherClosed):
        batcher.submit(3)


def test_close_without_drain_answers_the_queue() -> None:
    model = GatedModel()
    batcher = CooperativeBatcher(model, max_batch_size=8, max_latency_ms=0)
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(batcher.submit, 0)
        assert model.started.wait(10)
        queued = pool.submit(batcher.submit, 1)
        wait_until(lambda: batcher.stats().queued == 1)
        closing = pool.submit(batcher.close, drain=False)
        with pytest.raises(BatcherClosed):
            queued.result(10)
        model.gate.set()
        closing.result(10)
        assert running.result(10) == 0
    assert model.batches == [[0]]


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
