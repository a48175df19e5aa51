"""Property-based schedules: every call gets exactly one outcome, and its own.

Hypothesis draws the settings and a schedule of arrivals, cancellations, deadlines,
poison items and clock advances; a FakeClock makes each schedule deterministic.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from microbatch import Batcher, DeadlineExceeded, Overloaded
from microbatch.testing import FakeClock


class Poison(ValueError):
    pass


@dataclass(frozen=True)
class Item:
    id: int
    size: int
    poison: bool


@dataclass
class Submit:
    size: int
    poison: bool
    timeout_s: float | None


@dataclass
class Advance:
    seconds: float


@dataclass
class Cancel:
    index: int


@dataclass
class World:
    clock: FakeClock
    max_batch_size: int
    cost_s: float
    batches: list[list[Item]] = field(default_factory=list)
    cancelled: set[int] = field(default_factory=set)
    deadlines: dict[int, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    async def model(self, items: list[Item]) -> list[int]:
        now = self.clock.now()
        self.batches.append(list(items))
        if sum(item.size for item in items) > self.max_batch_size:
            self.violations.append(f"batch over its limit: {items}")
        for item in items:
            if item.id in self.cancelled:
                self.violations.append(f"computed a cancelled item: {item}")
            if item.id in self.deadlines and self.deadlines[item.id] < now:
                self.violations.append(f"computed an expired item: {item}")
        if self.cost_s:
            await self.clock.sleep(self.cost_s)
        if any(item.poison for item in items):
            raise Poison("poison in batch")
        return [item.id * 10 for item in items]


submits = st.builds(
    Submit,
    size=st.integers(1, 4),
    poison=st.sampled_from([False] * 7 + [True]),
    timeout_s=st.none() | st.sampled_from([0.001, 0.004, 0.02]),
)
advances = st.builds(Advance, seconds=st.sampled_from([0.0, 0.0005, 0.001, 0.003, 0.01]))
cancels = st.builds(Cancel, index=st.integers(0, 60))
schedules = st.lists(
    st.one_of(submits, submits, submits, advances, advances, cancels), min_size=30, max_size=150
)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    schedule=schedules,
    max_batch_size=st.integers(4, 9),
    max_latency_ms=st.sampled_from([0.0, 1.0, 5.0]),
    policy=st.sampled_from(["adaptive", "fixed"]),
    max_concurrent_batches=st.integers(1, 3),
    max_queue=st.integers(1, 30),
    cost_s=st.sampled_from([0.0, 0.0005, 0.002]),
    isolate_errors=st.booleans(),
    sized=st.booleans(),
)
def test_every_call_gets_exactly_its_own_outcome(
    schedule: list[Submit | Advance | Cancel],
    max_batch_size: int,
    max_latency_ms: float,
    policy: str,
    max_concurrent_batches: int,
    max_queue: int,
    cost_s: float,
    isolate_errors: bool,
    sized: bool,
) -> None:
    asyncio.run(
        run_schedule(
            schedule,
            max_batch_size=max_batch_size,
            max_latency_ms=max_latency_ms,
            policy=policy,
            max_concurrent_batches=max_concurrent_batches,
            max_queue=max_queue,
            cost_s=cost_s,
            isolate_errors=isolate_errors,
            sized=sized,
        )
    )


async def run_schedule(
    schedule: list[Submit | Advance | Cancel], *, cost_s: float, sized: bool, **config: object
) -> None:
    loop_errors: list[object] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
    clock = FakeClock()
    max_batch_size = int(config["max_batch_size"])  # type: ignore[call-overload]
    world = World(clock, max_batch_size, cost_s)
    batcher: Batcher[Item, int] = Batcher(
        world.model,
        clock=clock,
        size_fn=(lambda item: item.size) if sized else None,
        **config,  # type: ignore[arg-type]
    )
    items: list[Item] = []
    tasks: list[asyncio.Task[int]] = []
    for op in schedule:
        if isinstance(op, Submit):
            item = Item(len(items), op.size if sized else 1, op.poison)
            if op.timeout_s is not None:
                world.deadlines[item.id] = clock.now() + op.timeout_s
            items.append(item)
            tasks.append(asyncio.create_task(batcher.submit(item, timeout_s=op.timeout_s)))
        elif isinstance(op, Advance):
            await _settle()
            clock.advance(op.seconds)
        elif op.index < len(tasks) and not tasks[op.index].done():
            await _settle()
            if not tasks[op.index].done():
                world.cancelled.add(items[op.index].id)
                tasks[op.index].cancel()
        await _settle(2)

    # Let everything finish, then close (which waits for running batches): nothing
    # may hang, so the clock is only moved to the next timer while one is pending.
    closing: asyncio.Task[None] | None = None
    for _ in range(10_000):
        await _settle()
        if closing is None and all(task.done() for task in tasks):
            closing = asyncio.create_task(batcher.close())
            await _settle()
        if closing is not None and closing.done():
            break
        next_timer = clock.next_timer()
        assert next_timer is not None, "calls are pending but nothing is scheduled: a hang"
        clock.advance(max(next_timer - clock.now(), 0.0))
    assert all(task.done() for task in tasks), "some calls never got an answer"
    assert closing is not None and closing.done(), "close() never returned"

    assert not world.violations, world.violations
    assert not loop_errors, loop_errors
    poisoned_batches = [batch for batch in world.batches if any(i.poison for i in batch)]
    for item, task in zip(items, tasks, strict=True):
        if task.cancelled():
            assert item.id in world.cancelled
            continue
        error = task.exception()
        if error is None:
            assert task.result() == item.id * 10, "a caller got someone else's result"
            assert not item.poison
        elif isinstance(error, Poison):
            if config["isolate_errors"]:
                assert item.poison, "a good item failed with a neighbour's poison"
            else:
                assert any(item in batch for batch in poisoned_batches)
        elif isinstance(error, DeadlineExceeded):
            assert item.id in world.deadlines
        elif not isinstance(error, Overloaded):
            raise AssertionError(f"unexpected outcome for {item}: {error!r}")
    stats = batcher.stats()
    assert (stats.queued, stats.in_flight) == (0, 0)
    event(f"calls: {_bucket(len(tasks))}")
    event(f"batches: {_bucket(len(world.batches))}")


def _bucket(count: int) -> str:
    return "0" if not count else "1-9" if count < 10 else "10-29" if count < 30 else "30+"


async def _settle(rounds: int = 10) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)
