"""One timer for every item's deadline (``microbatch._deadlines``), on the fake clock."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch._deadlines import DeadlineWatch
from microbatch._entries import Entry
from microbatch.testing import FakeClock


class Item:
    """A queued entry with its deadline, and the times it was expired."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.entry = Entry(None, 1, 0.0, asyncio.get_running_loop().create_future(), deadline)
        self.future = self.entry.future
        self.expired_at: list[float] = []


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 10.0), st.none() | st.floats(0.0, 10.0)),
        max_size=200,
    )
)
def test_an_item_expires_once_at_its_deadline_unless_answered_first(
    plan: list[tuple[float, float | None]],
) -> None:
    async def scenario() -> None:
        clock = FakeClock(0.0)
        items: list[tuple[Item, float | None]] = []
        by_entry: dict[int, Item] = {}
        watch = DeadlineWatch(
            clock, lambda entry: by_entry[id(entry)].expired_at.append(clock.now())
        )
        for deadline, answered in plan:
            item = Item(deadline)
            items.append((item, answered))
            by_entry[id(item.entry)] = item
            watch.watch(item.entry, deadline)
        # answer each item at its time (if any), and advance through every deadline
        moments = sorted({t for _, a in plan for t in (a,) if t is not None} | {10.0})
        for moment in moments:
            clock.advance(moment - clock.now())
            for item, answered in items:
                if answered == moment and not item.future.done():
                    item.future.set_result(None)
                if item.expired_at and not item.future.done():
                    item.future.set_exception(TimeoutError())  # as the batcher does
        clock.advance(1.0)
        for item, answered in items:
            answered_first = answered is not None and answered < item.deadline
            if answered_first:
                assert item.expired_at == []
            else:
                assert len(item.expired_at) == 1 or answered == item.deadline
                assert all(at >= item.deadline for at in item.expired_at)
            if item.future.done() and item.future.exception() is not None:
                item.future.exception()  # retrieved
        assert len(watch) == 0  # all dropped once past
        watch.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("in_order", [True, False])
def test_answered_items_do_not_pile_up(in_order: bool) -> None:
    async def scenario() -> int:
        clock = FakeClock(0.0)
        watch = DeadlineWatch(clock, lambda entry: None)
        watch.watch(Item(100.0).entry, 100.0)  # later than every other: the rest come out of order
        largest = 0
        for index in range(10_000):
            deadline = 30.0 + (index if in_order else -index) * 1e-4
            item = Item(deadline)
            watch.watch(item.entry, deadline)
            item.future.set_result(None)  # answered long before its deadline
            largest = max(largest, len(watch))
        watch.close()
        return largest

    assert asyncio.run(scenario()) < 200


def test_the_first_deadline_arms_the_timer_and_a_later_one_does_not() -> None:
    async def scenario() -> list[float]:
        clock = FakeClock(0.0)
        expired: list[float] = []
        watch = DeadlineWatch(clock, lambda entry: expired.append(clock.now()))
        for deadline in (5.0, 7.0, 6.0, 2.0, 7.0):
            watch.watch(Item(deadline).entry, deadline)
        assert clock.next_timer() == 2.0  # the earliest, wherever it was kept
        clock.advance(10.0)
        return expired

    assert asyncio.run(scenario()) == [2.0, 5.0, 6.0, 7.0, 7.0]
