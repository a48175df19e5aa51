"""Property-based schedules: every call gets exactly one outcome, and its own.

Hypothesis draws the settings and a schedule of arrivals, cancellations, deadlines,
poison items, worker deaths and clock advances; a FakeClock makes each schedule
deterministic. A worker death ends a running batch the way a process pool reports
it: every item of that batch gets WorkerDied (nothing is raised, nothing re-run).
The batches go to the model as a function, or through a runner with one worker per
slot that holds batches handed over ahead (as a process pool does) and leaves out,
when it starts one, the items whose caller left or whose deadline passed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from microbatch import Batcher, DeadlineExceeded, Overloaded
from microbatch.errors import WorkerDied
from microbatch.execution import run_batch_async
from microbatch.testing import FakeClock
from microbatch.types import BatchDone, BatchJob


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
class Kill:
    """The worker running the oldest running batch dies."""


@dataclass
class World:
    clock: FakeClock
    max_batch_size: int
    cost_s: float
    batches: list[list[Item]] = field(default_factory=list)
    cancelled: set[int] = field(default_factory=set)
    deadlines: dict[int, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    running: list[asyncio.Future[None]] = field(default_factory=list)  # set: it died
    killed: set[int] = field(default_factory=set)

    def kill(self) -> None:
        if self.running:
            self.running.pop(0).set_result(None)

    async def model(self, items: list[Item]) -> list[object]:
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
            died = asyncio.get_running_loop().create_future()
            self.running.append(died)
            done = asyncio.ensure_future(self.clock.sleep(self.cost_s))
            await asyncio.wait({done, died}, return_when=asyncio.FIRST_COMPLETED)
            if died.done():
                done.cancel()
                self.killed.update(item.id for item in items)
                return [WorkerDied("the worker died")] * len(items)
            self.running.remove(died)
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
kills = st.builds(Kill)
schedules = st.lists(
    st.one_of(submits, submits, submits, advances, advances, cancels, kills),
    min_size=30,
    max_size=150,
)


settings_of_a_run = st.fixed_dictionaries(
    {
        "max_batch_size": st.integers(4, 9),
        "max_latency_ms": st.sampled_from([0.0, 1.0, 5.0]),
        "policy": st.sampled_from(["adaptive", "fixed"]),
        "max_concurrent_batches": st.integers(1, 3),
        "max_queue": st.integers(1, 30),
        "cost_s": st.sampled_from([0.0, 0.0005, 0.002]),
        "isolate_errors": st.booleans(),
        "sized": st.booleans(),
        "runner": st.booleans(),
    }
)
"""The batcher's settings and the model's cost, drawn for each schedule."""


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(schedule=schedules, run_settings=settings_of_a_run)
def test_every_call_gets_exactly_its_own_outcome(
    schedule: list[Submit | Advance | Cancel | Kill], run_settings: dict[str, Any]
) -> None:
    asyncio.run(run_schedule(schedule, **run_settings))


async def run_schedule(
    schedule: list[Submit | Advance | Cancel | Kill],
    *,
    cost_s: float,
    sized: bool,
    runner: bool = False,
    **config: object,
) -> Counter[str]:
    """Run one schedule and check every outcome; return the outcomes by kind."""
    loop_errors: list[object] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
    clock = FakeClock()
    max_batch_size = int(config["max_batch_size"])  # type: ignore[call-overload]
    world = World(clock, max_batch_size, cost_s)
    size_fn = (lambda item: item.size) if sized else None
    batcher: Batcher[Item, int]
    if runner:
        workers = int(config["max_concurrent_batches"])  # type: ignore[call-overload]
        world_runner = WorldRunner(world, workers, bool(config["isolate_errors"]))
        batcher = Batcher(
            runner=world_runner,
            clock=clock,
            size_fn=size_fn,
            **config,  # type: ignore[arg-type]
        )
    else:
        batcher = Batcher(world.model, clock=clock, size_fn=size_fn, **config)  # type: ignore[arg-type]
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
        elif isinstance(op, Kill):
            await _settle()
            world.kill()
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
    outcomes: Counter[str] = Counter()
    for item, task in zip(items, tasks, strict=True):
        if task.cancelled():
            assert item.id in world.cancelled
            outcomes["cancelled"] += 1
            continue
        error = task.exception()
        outcomes[type(error).__name__ if error else "result"] += 1
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
        elif isinstance(error, WorkerDied):
            assert item.id in world.killed, "WorkerDied for an item no dead worker held"
        elif not isinstance(error, Overloaded):
            raise AssertionError(f"unexpected outcome for {item}: {error!r}")
    stats = batcher.stats()
    assert (stats.queued, stats.in_flight) == (0, 0)
    event(f"calls: {_bucket(len(tasks))}")
    event(f"batches: {_bucket(len(world.batches))}")
    event(f"worker deaths: {_bucket(outcomes['WorkerDied'])}")
    return outcomes


class WorldRunner:
    """The world's model behind a runner with ``workers`` workers, each taking the
    batches handed to it in turn."""

    def __init__(self, world: World, workers: int, isolate_errors: bool) -> None:
        self.world = world
        self.free = asyncio.Semaphore(workers)
        self.isolate = isolate_errors
        self.started: dict[int, float] = {}

    def running_since(self) -> float | None:
        return min(self.started.values(), default=None)

    async def run(self, job: BatchJob) -> BatchDone:
        world = self.world
        if list(job.deadlines) != [world.deadlines.get(item.id) for item in job.items]:
            world.violations.append(f"deadlines {job.deadlines} handed with {job.items}")
        async with self.free:
            keep = [i for i in range(len(job.items)) if job.wanted(i)]
            placed: list[object] = [DeadlineExceeded("left out")] * len(job.items)
            if not keep:
                return BatchDone(placed)
            started = world.clock.now()
            self.started[id(job)] = started
            try:
                outcomes = await run_batch_async(
                    world.model,
                    [job.items[i] for i in keep],
                    self.isolate,
                    lambda k: job.wanted(keep[k]),
                )
            finally:
                del self.started[id(job)]
        for index, outcome in zip(keep, outcomes, strict=True):
            placed[index] = outcome
        units = sum(job.items[i].size for i in keep)
        return BatchDone(placed, started, world.clock.now(), units)


def _bucket(count: int) -> str:
    return "0" if not count else "1-9" if count < 10 else "10-29" if count < 30 else "30+"


async def _settle(rounds: int = 10) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)
