"""TimerHeap: many timers on one timer of a clock, the same callbacks at the same
times as the clock's own timers would run them."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from microbatch._timer_heap import TimerHeap
from microbatch.testing import FakeClock


def test_timers_run_in_order_of_time_then_of_setting_at_their_time() -> None:
    clock = FakeClock()
    heap = TimerHeap(clock)
    ran: list[tuple[str, float]] = []
    for name, when in [("c", 3.0), ("a", 1.0), ("b", 1.0), ("d", 2.0)]:
        heap.call_at(when, lambda name=name: ran.append((name, clock.now())))
    assert clock.pending_timers() == 1  # one timer of the clock for all four
    clock.advance(10)
    assert ran == [("a", 1.0), ("b", 1.0), ("d", 2.0), ("c", 3.0)]
    assert len(heap) == 0 and clock.pending_timers() == 0


def test_a_timer_called_off_does_not_run() -> None:
    clock = FakeClock()
    heap = TimerHeap(clock)
    ran: list[int] = []
    first = heap.call_at(1.0, lambda: ran.append(1))
    heap.call_at(2.0, lambda: ran.append(2))
    first.cancel()
    first.cancel()  # twice: no effect
    clock.advance(1.5)
    assert ran == []
    clock.advance(1.0)
    assert ran == [2]
    assert len(heap) == 0


def test_called_off_timers_do_not_pile_up() -> None:
    clock = FakeClock()
    heap = TimerHeap(clock)
    timers = [heap.call_at(30.0 + k, lambda: None) for k in range(300)]
    for timer in timers[:250]:
        timer.cancel()
    assert len(heap) < 150  # rebuilt without most of them
    ran: list[int] = []
    heap.call_at(1.0, lambda: ran.append(1))
    clock.advance(400)  # past every timer set
    assert ran == [1] and len(heap) == 0


def test_a_callback_that_raises_is_logged_and_the_others_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    heap = TimerHeap(clock)
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("broken timer")

    heap.call_at(1.0, broken)
    heap.call_at(1.0, lambda: ran.append("after"))
    with caplog.at_level(logging.ERROR, logger="microbatch"):
        clock.advance(2)
    assert ran == ["after"]
    assert "a timer's callback failed" in caplog.text


def test_a_callback_may_set_timers_earlier_than_the_next() -> None:
    clock = FakeClock()
    heap = TimerHeap(clock)
    ran: list[tuple[str, float]] = []
    heap.call_at(5.0, lambda: ran.append(("late", clock.now())))
    heap.call_at(
        1.0, lambda: heap.call_at(2.0, lambda: ran.append(("set by a callback", clock.now())))
    )
    clock.advance(10)
    assert ran == [("set by a callback", 2.0), ("late", 5.0)]


# set (at a time), call off (the k-th set so far), or advance the clock
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.floats(0, 20, allow_nan=False)),
        st.tuples(st.just("off"), st.integers(0, 50)),
        st.tuples(st.just("advance"), st.floats(0, 5, allow_nan=False)),
    ),
    max_size=60,
)


@given(OPERATIONS)
def test_the_same_callbacks_at_the_same_times_as_the_clocks_own_timers(
    operations: list[tuple[str, float]],
) -> None:
    own, shared = FakeClock(), FakeClock()
    heap = TimerHeap(shared)
    runs: dict[str, list[tuple[int, float]]] = {"own": [], "heap": []}
    timers: list[tuple[object, object]] = []
    for kind, value in operations:
        if kind == "set":
            k = len(timers)
            timers.append(
                (
                    own.call_at(value, lambda k=k: runs["own"].append((k, own.now()))),
                    heap.call_at(value, lambda k=k: runs["heap"].append((k, shared.now()))),
                )
            )
        elif kind == "off" and timers:
            for timer in timers[int(value) % len(timers)]:
                timer.cancel()  # type: ignore[attr-defined]
        elif kind == "advance":
            own.advance(value)
            shared.advance(value)
        assert runs["heap"] == runs["own"]
        assert shared.pending_timers() <= 1
    own.advance(100)
    shared.advance(100)
    assert runs["heap"] == runs["own"]
