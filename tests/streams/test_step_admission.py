"""Admission of streams within ``max_active`` and a cost budget, and joiners
gathered into fewer starts, on a fake clock.

Hypothesis draws the limits (``max_active``, ``max_cost``, padded or summed cost,
how many joiners to gather and for how long) and a schedule of arrivals (each with
a cost and a length) and clock advances. Every step must stay within
``max_active`` and the budget; an item that alone costs more than the budget is
refused with ItemTooLarge before its stream starts; every other stream gets all its
chunks (nobody starves, also when callers leave), and streams start in the order
they were opened. A caller that leaves (its reading task cancelled, its stream
closed) frees its place: no step after it left computes its item, and every stream
gets exactly one end.

Every await is bounded in real time (``_BOUND_S``): a schedule that leaves the loop
waiting fails that example at once instead of hanging the event loop (pytest's
timeout cannot stop a hang that hypothesis then shrinks, example after example).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch.errors import ItemTooLarge
from microbatch.step_execution import StepExecutor
from microbatch.stepping import StepDone, StepJob, StepLoop
from microbatch.streams import Channel, Stream
from microbatch.testing import FakeClock

STEP_S = 0.001
_BOUND_S = 20.0  # real seconds any one example may take


@dataclass(frozen=True)
class Item:
    id: int
    cost: int
    length: int


@dataclass
class Arrive:
    cost: int
    length: int


@dataclass
class Wait:
    seconds: float


@dataclass
class Leave:
    """The caller of the ``index``-th stream opened leaves (if it is still open)."""

    index: int


@dataclass
class Limits:
    max_active: int
    max_cost: int | None
    mode: Literal["padded", "sum"]
    min_joiners: int
    max_join_wait_s: float


@dataclass
class Log:
    limits: Limits
    violations: list[str] = field(default_factory=list)
    started: list[int] = field(default_factory=list)  # item ids, in start order
    starts: int = 0  # calls of start (each costs about a step)
    peak: int = 0  # most items in one step
    left: set[int] = field(default_factory=set)  # item ids whose caller left
    ends: Counter[int] = field(default_factory=Counter)  # item id -> ends of its stream

    def check(self, items: list[Item]) -> None:
        limits = self.limits
        self.peak = max(self.peak, len(items))
        for item in items:
            if item.id in self.left:
                self.violations.append(f"stepped item {item.id} after its caller left")
        if len(items) > limits.max_active:
            self.violations.append(f"{len(items)} active > {limits.max_active}")
        if limits.max_cost is not None and items:
            costs = [item.cost for item in items]
            cost = sum(costs) if limits.mode == "sum" else max(costs) * len(costs)
            if cost > limits.max_cost:
                self.violations.append(f"active cost {cost} > {limits.max_cost}")


class CountingModel:
    """Item ``i`` of length ``n`` yields ``"i:0"`` ... ``"i:{n-1}"``."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def start(self, items: list[Item]) -> list[list[Any]]:
        self.log.starts += 1
        self.log.started.extend(item.id for item in items)
        return [[item, 0] for item in items]

    def step(self, states: list[list[Any]]) -> tuple[list[str], list[bool]]:
        self.log.check([item for item, _ in states])
        chunks = []
        for state in states:
            chunks.append(f"{state[0].id}:{state[1]}")
            state[1] += 1
        return chunks, [item.length == position for item, position in states]


class ClockedRunner:
    """Each step takes ``STEP_S`` on the fake clock."""

    def __init__(self, log: Log, clock: FakeClock) -> None:
        self.executor = StepExecutor(CountingModel(log), clock=clock.now)
        self.clock = clock

    async def advance(self, job: StepJob) -> StepDone:
        done = self.executor.advance(job)
        await self.clock.sleep(STEP_S)
        return done


async def _collect(stream: Stream) -> list[str]:
    return [chunk async for chunk in stream]


async def _settle(rounds: int = 8) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def run(limits: Limits, schedule: list[Arrive | Wait | Leave]) -> Log:
    """Run the schedule in a fresh event loop, bounded in real time."""
    return asyncio.run(asyncio.wait_for(_run(limits, schedule), _BOUND_S))


async def _run(limits: Limits, schedule: list[Arrive | Wait | Leave]) -> Log:
    clock = FakeClock()
    log = Log(limits)
    loop = StepLoop(
        ClockedRunner(log, clock),
        max_active=limits.max_active,
        clock=clock,
        cost_fn=lambda item: item.cost,
        max_cost=limits.max_cost,
        cost_mode=limits.mode,
        min_joiners=limits.min_joiners,
        max_join_wait_s=limits.max_join_wait_s,
    )
    items: list[Item] = []
    streams: dict[int, Stream] = {}
    tasks: dict[int, asyncio.Task[list[str]]] = {}

    def ended(channel: Channel) -> None:
        log.ends[channel.item.id] += 1

    for op in schedule:
        if isinstance(op, Arrive):
            item = Item(len(items), op.cost, op.length)
            items.append(item)
            try:
                stream = loop.open(item, on_end=ended)
            except ItemTooLarge:
                assert limits.max_cost is not None and item.cost > limits.max_cost
                continue
            assert limits.max_cost is None or item.cost <= limits.max_cost
            streams[item.id] = stream
            tasks[item.id] = asyncio.create_task(_collect(stream))
        elif isinstance(op, Leave):
            ids = list(tasks)
            leaving = ids[op.index] if op.index < len(ids) else None
            if leaving is not None and not tasks[leaving].done():
                # A caller leaves: its reader is cancelled (perhaps before it
                # started reading) and its stream closed, as a handler's finally does.
                log.left.add(leaving)
                tasks[leaving].cancel()
                await streams[leaving].aclose()
        else:
            await _settle()
            clock.advance(op.seconds)
        await _settle(2)

    # Nobody starves: with only the clock moving, every stream ends, and then the
    # loop stops (a step that drops the states of callers who left included).
    closing: asyncio.Task[None] | None = None
    for _ in range(20_000):
        await _settle()
        if closing is None and all(task.done() for task in tasks.values()):
            closing = asyncio.create_task(loop.close())
            await _settle()
        if closing is not None and closing.done():
            break
        next_timer = clock.next_timer()
        if next_timer is not None:
            clock.advance(max(next_timer - clock.now(), 0.0))
    assert closing is not None, "a stream never ended"
    assert closing.done(), "the loop did not stop after its last stream ended"
    closing.result()

    for item_id, task in tasks.items():
        assert log.ends[item_id] == 1, f"stream {item_id} ended {log.ends[item_id]} times"
        if item_id in log.left:
            assert task.cancelled() or task.result() == [
                f"{item_id}:{k}" for k in range(items[item_id].length)
            ]  # it may have ended before the cancellation reached it
            continue
        length = items[item_id].length
        assert task.result() == [f"{item_id}:{k}" for k in range(length)]
        assert item_id in log.started
    assert log.started == sorted(log.started), "streams started out of order"
    assert not log.violations, log.violations
    assert (loop.load, loop.stats().active) == (0, 0)
    return log


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    limits=st.builds(
        Limits,
        max_active=st.integers(1, 6),
        max_cost=st.none() | st.integers(1, 40),
        mode=st.sampled_from(["padded", "sum"]),
        min_joiners=st.integers(1, 5),
        max_join_wait_s=st.sampled_from([0.0, 0.002, 0.01]),
    ),
    schedule=st.lists(
        st.builds(Arrive, cost=st.integers(0, 30), length=st.integers(1, 10))
        | st.builds(Wait, seconds=st.sampled_from([0.0, 0.0005, 0.001, 0.004]))
        | st.builds(Leave, index=st.integers(0, 30)),
        min_size=5,
        max_size=60,
    ),
)
def test_admission_keeps_the_limits_and_order_and_nobody_starves(
    limits: Limits, schedule: list[Arrive | Wait | Leave]
) -> None:
    run(limits, schedule)


def test_an_item_over_the_budget_is_refused_before_its_stream_starts() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        log = Log(Limits(4, 10, "padded", 1, 0.0))
        loop = StepLoop(
            ClockedRunner(log, clock),
            max_active=4,
            clock=clock,
            cost_fn=lambda item: item.cost,
            max_cost=10,
        )
        with pytest.raises(ItemTooLarge, match="exceeds max_batch_cost=10"):
            loop.open(Item(0, 11, 1))
        assert loop.load == 0 and log.starts == 0
        await loop.close()

    asyncio.run(asyncio.wait_for(scenario(), _BOUND_S))


def test_padded_budget_lets_fewer_long_items_run_together() -> None:
    """Padded cost 10: items of cost 5 run two at a time, of cost 2 five at a time."""
    limits = Limits(8, 10, "padded", 1, 0.0)
    log = run(limits, [Arrive(5, 6) for _ in range(4)])
    assert log.peak == 2
    log = run(limits, [Arrive(2, 6) for _ in range(6)])
    assert log.peak == 5


def test_gathering_joiners_takes_fewer_starts() -> None:
    """One arrival per step while a long item runs: continuous admission starts at
    almost every step; gathering four joiners (or 10 ms) starts once per four."""
    schedule: list[Arrive | Wait] = [Arrive(1, 200)]
    for _ in range(16):
        schedule += [Wait(STEP_S), Arrive(1, 2)]
    each = run(Limits(32, None, "sum", 1, 0.0), schedule)
    grouped = run(Limits(32, None, "sum", 4, 0.01), schedule)
    assert each.starts >= 16
    assert grouped.starts <= 6


def test_a_lone_joiner_waits_at_most_max_join_wait_s() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        log = Log(Limits(8, None, "sum", 4, 0.005))
        loop = StepLoop(
            ClockedRunner(log, clock),
            max_active=8,
            clock=clock,
            min_joiners=4,
            max_join_wait_s=0.005,
        )
        long = loop.open(Item(0, 0, 100))
        await _settle()
        clock.advance(STEP_S)
        await _settle()
        joiner = loop.open(Item(1, 0, 1))
        chunks = asyncio.create_task(_collect(joiner))
        for _ in range(4):  # four steps: not yet 5 ms
            clock.advance(STEP_S)
            await _settle()
        assert log.started == [0]
        for _ in range(3):
            clock.advance(STEP_S)
            await _settle()
        assert log.started == [0, 1]
        clock.advance(STEP_S)
        await _settle()
        assert chunks.done() and chunks.result() == ["1:0"]
        del long
        closing = asyncio.create_task(loop.close())
        for _ in range(10):
            await _settle()
            clock.advance(STEP_S)
        await closing

    asyncio.run(asyncio.wait_for(scenario(), _BOUND_S))


def test_bad_limits_are_refused() -> None:
    clock = FakeClock()
    runner = ClockedRunner(Log(Limits(1, None, "sum", 1, 0.0)), clock)
    with pytest.raises(ValueError, match="cost_fn"):
        StepLoop(runner, max_active=2, max_cost=5)
    with pytest.raises(ValueError, match="cost_mode"):
        StepLoop(runner, max_active=2, cost_mode="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_joiners"):
        StepLoop(runner, max_active=2, min_joiners=0)
