"""Property-based schedules of streams through the step loop, on a fake clock.

Hypothesis draws the settings and a schedule of stream arrivals (random lengths,
per-item errors at a random step, deadlines for the first chunk and the whole
stream), cancellations, clock advances and worker deaths. Every stream must get
exactly its own chunks, in order, and exactly one end; no step may compute an item
whose caller left (or whose deadline passed) before the step began; ``max_active``
is never exceeded; a failing item fails alone; with ``restart`` (idempotent steps),
an item whose worker died starts again and its caller gets no chunk twice. Either
the first step makes an item's first chunk, or its start does (``Started``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch.errors import DeadlineExceeded, ItemError, Overloaded, WorkerDied
from microbatch.step_execution import StepExecutor
from microbatch.stepping import Started, StepDone, StepJob, StepLoop, continuous, lockstep
from microbatch.streams import Channel, Stream
from microbatch.testing import FakeClock

_BOUND_S = 20.0  # real seconds one example may take: a hang fails, not stalls


@dataclass(frozen=True)
class Item:
    id: int
    length: int
    fails_at: int | None  # the step at which stepping this item raises
    bad_start: bool  # starting this item raises


@dataclass
class Open:
    length: int
    fails_at: int | None
    bad_start: bool
    timeout_s: float | None
    first_chunk_timeout_s: float | None


@dataclass
class Advance:
    seconds: float


@dataclass
class Cancel:
    index: int


@dataclass
class Kill:
    """The worker holding the states dies during the running step."""


@dataclass
class World:
    clock: FakeClock
    max_active: int
    cost_s: float
    left: set[int] = field(default_factory=set)  # the stream learnt its caller left
    cancelled: set[int] = field(default_factory=set)  # the test cancelled the reader
    deadlines: dict[int, float] = field(default_factory=dict)  # whole streams
    first_deadlines: dict[int, float] = field(default_factory=dict)
    streams: dict[int, Stream] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)
    running: list[asyncio.Future[None]] = field(default_factory=list)
    ends: Counter[int] = field(default_factory=Counter)
    timed: set[int] = field(default_factory=set)  # items opened with a deadline
    restarted: set[int] = field(default_factory=set)  # items whose worker died once

    def check(self, states: list[list[Any]]) -> None:
        now = self.clock.now()
        if len(states) > self.max_active:
            self.violations.append(f"{len(states)} active > max_active {self.max_active}")
        for item, _ in states:
            if item.id in self.left:
                self.violations.append(f"stepped item {item.id} after its caller left")
            dues = [self.deadlines.get(item.id)]
            if self.streams[item.id].chunks_sent == 0:
                dues.append(self.first_deadlines.get(item.id))
            if any(due is not None and due <= now for due in dues):
                self.violations.append(f"stepped item {item.id} past its deadline")


class WorldModel:
    """Item ``i`` yields ``"i:0"``, ``"i:1"``, ... for ``length`` steps; with
    ``prefill``, ``start`` makes ``"i:0"`` itself (:class:`Started`)."""

    def __init__(self, world: World, prefill: bool = False) -> None:
        self.world = world
        self.prefill = prefill

    def start(self, items: list[Item]) -> list[Any]:
        if any(item.bad_start for item in items):
            raise ItemError("bad start")
        if not self.prefill:
            return [[item, 0] for item in items]
        self.world.check([[item, 0] for item in items])
        for item in items:  # raise before making any state
            if item.fails_at == 0:
                raise ItemError(f"item {item.id} failed at step 0")
        return [Started([item, 1], f"{item.id}:0", item.length == 1) for item in items]

    def step(self, states: list[list[Any]]) -> tuple[list[str], list[bool]]:
        self.world.check(states)
        for item, position in states:  # raise before changing any state
            if item.fails_at == position:
                raise ItemError(f"item {item.id} failed at step {position}")
        chunks = []
        for state in states:
            item, position = state
            chunks.append(f"{item.id}:{position}")
            state[1] = position + 1
        return chunks, [item.length == position for item, position in states]


class WorldRunner:
    """The model in its executor, each step taking ``cost_s`` on the fake clock; a
    kill during a step loses every state."""

    def __init__(self, world: World, prefill: bool = False) -> None:
        self.world = world
        self.executor = StepExecutor(WorldModel(world, prefill), clock=world.clock.now)
        self.holding: set[int] = set()  # item ids whose state is held

    async def advance(self, job: StepJob) -> StepDone:
        world = self.world
        done = self.executor.advance(job)
        if world.cost_s:
            died = asyncio.get_running_loop().create_future()
            world.running.append(died)
            sleep = asyncio.ensure_future(world.clock.sleep(world.cost_s))
            await asyncio.wait({sleep, died}, return_when=asyncio.FIRST_COMPLETED)
            if died.done():
                sleep.cancel()
                self.executor.clear()
                raise WorkerDied("the worker died")
            world.running.remove(died)
        return done


opens = st.builds(
    Open,
    length=st.integers(1, 12),
    fails_at=st.none() | st.none() | st.none() | st.integers(0, 12),
    bad_start=st.sampled_from([False] * 9 + [True]),
    timeout_s=st.none() | st.sampled_from([0.002, 0.01, 0.05]),
    first_chunk_timeout_s=st.none() | st.sampled_from([0.001, 0.005]),
)
advances = st.builds(Advance, seconds=st.sampled_from([0.0, 0.0005, 0.001, 0.003]))
schedules = st.lists(
    st.one_of(opens, opens, opens, advances, advances, st.builds(Cancel, st.integers(0, 40)))
    | st.builds(Kill),
    min_size=20,
    max_size=100,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    schedule=schedules,
    max_active=st.integers(1, 6),
    max_queue=st.integers(1, 20),
    cost_s=st.sampled_from([0.0, 0.001]),
    admission=st.sampled_from([continuous, lockstep]),
    restart=st.booleans(),
    prefill=st.booleans(),
)
def test_every_stream_gets_exactly_its_own_chunks_and_one_end(
    schedule: list[Open | Advance | Cancel | Kill],
    max_active: int,
    max_queue: int,
    cost_s: float,
    admission: Any,
    restart: bool,
    prefill: bool,
) -> None:
    asyncio.run(
        asyncio.wait_for(
            run_schedule(schedule, max_active, max_queue, cost_s, admission, restart, prefill),
            _BOUND_S,
        )
    )


async def run_schedule(
    schedule: list[Open | Advance | Cancel | Kill],
    max_active: int,
    max_queue: int,
    cost_s: float,
    admission: Any,
    restart: bool = False,
    prefill: bool = False,
) -> Counter[str]:
    loop_errors: list[object] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
    clock = FakeClock()
    world = World(clock, max_active, cost_s)
    runner = WorldRunner(world, prefill)
    loop = StepLoop(
        runner,
        max_active=max_active,
        max_queue=max_queue,
        admission=admission,
        clock=clock,
        restart=restart,
    )
    items: list[Item] = []
    received: list[list[str]] = []
    tasks: list[asyncio.Task[None] | None] = []

    async def consume(stream: Stream, into: list[str]) -> None:
        async for chunk in stream:
            into.append(chunk)

    def ended(stream: Channel) -> None:
        world.ends[stream.item.id] += 1
        if stream.left:
            world.left.add(stream.item.id)

    for op in schedule:
        if isinstance(op, Open):
            item = Item(len(items), op.length, op.fails_at, op.bad_start)
            items.append(item)
            received.append([])
            now = clock.now()
            deadline = None if op.timeout_s is None else now + op.timeout_s
            first = None if op.first_chunk_timeout_s is None else now + op.first_chunk_timeout_s
            if deadline is not None or first is not None:
                world.timed.add(item.id)
            if deadline is not None:
                world.deadlines[item.id] = deadline
            if first is not None:
                world.first_deadlines[item.id] = first
            try:
                stream = loop.open(
                    item, deadline=deadline, first_chunk_deadline=first, on_end=ended
                )
            except Overloaded:
                tasks.append(None)
                continue
            world.streams[item.id] = stream
            tasks.append(asyncio.create_task(consume(stream, received[-1])))
        elif isinstance(op, Advance):
            await _settle()
            clock.advance(op.seconds)
        elif isinstance(op, Kill):
            await _settle()
            if world.running:
                held = _held(runner, loop)
                # With restart, an item dies only with its second worker.
                world.killed.update(held if not restart else held & world.restarted)
                world.restarted.update(held)
                world.running.pop(0).set_result(None)
        else:
            task = tasks[op.index] if op.index < len(tasks) else None
            if task is not None and not task.done():
                # The caller leaves: its reader is cancelled (perhaps before it
                # started reading) and its stream closed, as a handler's finally does.
                world.cancelled.add(op.index)
                task.cancel()
                await world.streams[op.index].aclose()
        await _settle(2)

    # Steps that cost no time need only turns of the event loop; the others need
    # the clock moved to the next timer. Nothing else may be needed to end them all.
    for _ in range(10_000):
        await _settle()
        if all(task is None or task.done() for task in tasks):
            break
        next_timer = clock.next_timer()
        if next_timer is None:
            continue
        clock.advance(max(next_timer - clock.now(), 0.0))
    assert all(task is None or task.done() for task in tasks), "a stream never ended"
    closing = asyncio.create_task(loop.close())
    for _ in range(100):
        await _settle()
        if closing.done():
            break
        clock.advance(cost_s)
    assert closing.done()
    closing.result()

    assert not world.violations, world.violations
    assert not loop_errors, loop_errors
    outcomes: Counter[str] = Counter()
    for item, task, chunks in zip(items, tasks, received, strict=True):
        expected = [f"{item.id}:{k}" for k in range(item.length)]
        assert chunks == expected[: len(chunks)], f"{item} got {chunks}"
        if task is None:
            outcomes["overloaded"] += 1
            assert world.ends[item.id] == 0
            continue
        assert world.ends[item.id] == 1, f"{item} ended {world.ends[item.id]} times"
        if task.cancelled():
            assert item.id in world.cancelled
            outcomes["left"] += 1
            continue
        error = task.exception()
        outcomes[type(error).__name__ if error else "complete"] += 1
        if error is None:
            assert chunks == expected
            assert item.fails_at is None or item.fails_at >= item.length
            assert not item.bad_start
        elif isinstance(error, ItemError):
            if "bad start" in str(error):
                assert item.bad_start
            else:
                assert str(error) == f"item {item.id} failed at step {item.fails_at}"
                assert len(chunks) == item.fails_at
        elif isinstance(error, DeadlineExceeded):
            assert item.id in world.timed
        elif isinstance(error, WorkerDied):
            assert item.id in world.killed, f"{item} got WorkerDied but was not held"
        else:
            raise AssertionError(f"unexpected end of {item}: {error!r}")
    stats = loop.stats()
    assert (stats.active, stats.waiting) == (0, 0)
    assert stats.opened == stats.completed + stats.failed + stats.left
    return outcomes


def _held(runner: WorldRunner, loop: StepLoop) -> set[int]:
    """The ids of the items whose state the running step holds (they die with it)."""
    return {stream.item.id for stream in loop._active.values()}


async def _settle(rounds: int = 8) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_a_loop_that_breaks_ends_every_stream() -> None:
    """A bug in the loop (here: an admission policy that raises) must not leave a
    caller waiting: every open stream ends with the error."""

    def broken(active: int, waiting: int, max_active: int) -> int:
        raise RuntimeError("policy bug")

    world = World(FakeClock(), max_active=2, cost_s=0.0)
    loop = StepLoop(WorldRunner(world), max_active=2, admission=broken, clock=world.clock)
    streams = [loop.open(Item(i, 3, None, False)) for i in range(3)]
    for stream in streams:
        try:
            await asyncio.wait_for(stream.__anext__(), _BOUND_S)
        except RuntimeError as error:
            assert str(error) == "policy bug"
        else:
            raise AssertionError("a stream of a broken loop gave a chunk")
    assert loop.load == 0
