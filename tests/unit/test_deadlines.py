"""One timer for every item's deadline (``microbatch._deadlines``), on the fake clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch._deadlines import DeadlineWatch
from microbatch.testing import FakeClock


@dataclass(eq=False)
class Item:
    deadline: float
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.Future())
    expired_at: list[float] = field(default_factory=list)


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
        watch: DeadlineWatch[Item] = DeadlineWatch(
            clock, lambda item: item.expired_at.append(clock.now())
        )
        for deadline, answered in plan:
            item = Item(deadline)
            items.append((item, answered))
            watch.watch(item, deadline)
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


def test_answered_items_do_not_pile_up() -> None:
    async def scenario() -> int:
        clock = FakeClock(0.0)
        watch: DeadlineWatch[Item] = DeadlineWatch(clock, lambda item: None)
        largest = 0
        for _ in range(10_000):
            item = Item(30.0)
            watch.watch(item, 30.0)
            item.future.set_result(None)  # answered long before its deadline
            largest = max(largest, len(watch))
        watch.close()
        return largest

    assert asyncio.run(scenario()) < 200
