"""Property-based schedules for batch composition, on the fake clock.

Random item costs and arrival waves go through the asyncio batcher with a cost
budget, with or without grouping by cost, to a model that takes a fixed time per
batch and, in some runs, runs out of memory above a hidden batch cost. Every item
must be answered exactly once with its own result (or its own error), no batch may
exceed its budget, no item may be passed over more often than there were items
ahead of it, and out-of-memory splitting must never lose or repeat an item.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch import Batcher, DeadlineExceeded
from microbatch.composition import batch_cost
from microbatch.testing import FakeClock


@dataclass(frozen=True)
class Text:
    id: int
    tokens: int


@dataclass
class _Costed:
    cost: float
    peak: float
    rows: int = 1


@dataclass
class World:
    clock: FakeClock
    budget: float
    mode: str
    hidden_limit: float | None
    batch_s: float
    calls: list[list[Text]] = field(default_factory=list)
    failed_calls: list[list[Text]] = field(default_factory=list)
    computed: Counter[int] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    call_times: list[float] = field(default_factory=list)
    arrivals: dict[int, float] = field(default_factory=dict)

    def cost(self, texts: list[Text]) -> float:
        return batch_cost([_Costed(t.tokens, t.tokens) for t in texts], self.mode)  # type: ignore[arg-type]

    async def model(self, texts: list[Text]) -> list[int]:
        self.calls.append(list(texts))
        self.call_times.append(self.clock.now())
        cost = self.cost(texts)
        if len(texts) > 1 and cost > self.budget:
            self.violations.append(f"batch of cost {cost} over the budget {self.budget}")
        await self.clock.sleep(self.batch_s)
        if self.hidden_limit is not None and cost > self.hidden_limit:
            self.failed_calls.append(list(texts))
            raise MemoryError(f"batch of cost {cost}")
        self.computed.update(t.id for t in texts)
        return [t.id * 10 for t in texts]


async def _settle(rounds: int = 1) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


waves = st.lists(
    st.tuples(
        st.integers(0, 8),  # texts arriving together
        st.sampled_from([4, 8, 16, 24, 32, 64, 128, 256]),  # their token count
        st.sampled_from([0.0, 0.001, 0.005, 0.02]),  # time until the next wave
        st.sampled_from([None, None, None, 0.01, 0.05]),  # their timeout
    ),
    min_size=3,
    max_size=40,
)


async def run_waves(
    waves: list[tuple[int, int, float, float | None]],
    *,
    hidden_limit: float | None,
    batch_s: float,
    budget: float,
    mode: str,
    **config: Any,
) -> tuple[World, Batcher[Text, int], list[tuple[Text, asyncio.Task[int], int, int]]]:
    clock = FakeClock()
    world = World(clock, budget, mode, hidden_limit, batch_s)
    batcher: Batcher[Text, int] = Batcher(
        world.model,
        clock=clock,
        cost_fn=lambda text: text.tokens,
        max_batch_cost=budget,
        batch_cost=mode,
        max_concurrent_batches=1,
        **config,
    )
    calls: list[tuple[Text, asyncio.Task[int], int, int]] = []
    for count, tokens, gap, timeout in waves:
        for _ in range(count):
            text = Text(len(calls), tokens)
            world.arrivals[text.id] = clock.now()
            stats = batcher.stats()
            task = asyncio.create_task(batcher.submit(text, timeout_s=timeout))
            calls.append((text, task, stats.batches, stats.queued))
            await _settle()
        await _settle(3)
        clock.advance(gap)
        await _settle(3)
    # Let everything finish, then close (which waits for running batches): the clock
    # only moves to the next timer while one is pending, so a hang is caught.
    closing: asyncio.Task[None] | None = None
    for _ in range(100_000):
        await _settle(3)
        if closing is None and all(task.done() for _, task, _, _ in calls):
            closing = asyncio.create_task(batcher.close())
            await _settle(3)
        if closing is not None and closing.done():
            break
        next_timer = clock.next_timer()
        assert next_timer is not None, "calls are pending but nothing is scheduled: a hang"
        clock.advance(max(next_timer - clock.now(), 0.0))
    assert closing is not None and closing.done(), "close() never returned"
    return world, batcher, calls


composition_settings = st.fixed_dictionaries(
    {
        "budget": st.sampled_from([256.0, 512.0, 2048.0]),
        "mode": st.sampled_from(["padded", "sum"]),
        "group_by_cost": st.booleans(),
        "group_window": st.sampled_from([4, 64]),
        "max_batch_size": st.integers(2, 32),
        "max_latency_ms": st.sampled_from([0.0, 2.0, 10.0]),
        "policy": st.sampled_from(["adaptive", "fixed"]),
        "max_wait_ms": st.sampled_from([None, 1.0, 50.0]),
        "batch_s": st.sampled_from([0.001, 0.004]),
    }
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(waves=waves, run=composition_settings)
def test_budgets_hold_and_every_text_is_answered_once_and_never_starves(
    waves: list[tuple[int, int, float, float | None]], run: dict[str, Any]
) -> None:
    world, batcher, calls = asyncio.run(run_waves(waves, hidden_limit=None, **run))
    assert not world.violations, world.violations
    release = {text.id: index for index, batch in enumerate(world.calls) for text in batch}
    max_wait_s = batcher.config.new_composer().max_wait_s
    for text, task, released_before, ahead in calls:
        error = task.exception()
        if error is None:
            assert task.result() == text.id * 10, "a caller got someone else's result"
            # Without splits each model call is one released batch. Past the age
            # bound, the text went in one of the next ``ahead + 1`` batches (or
            # FIFO: in one of the next ``ahead + 1`` at all), however skewed the
            # arrivals.
            overdue_at = world.arrivals[text.id] + (max_wait_s if run["group_by_cost"] else 0)
            passed = [
                i
                for i in range(released_before, release[text.id])
                if world.call_times[i] >= overdue_at - 1e-9
            ]
            assert len(passed) <= ahead, "a text starved"
        else:
            assert isinstance(error, DeadlineExceeded), error
    assert all(count == 1 for count in world.computed.values()), "a text computed twice"
    stats = batcher.stats()
    assert (stats.queued, stats.in_flight) == (0, 0)
    assert stats.oom_splits == 0 and stats.cost_ceiling is None


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    waves=waves,
    run=composition_settings,
    hidden_limit=st.sampled_from([30.0, 100.0, 300.0]),
    isolate_errors=st.booleans(),
)
def test_out_of_memory_splitting_never_loses_or_repeats_a_text(
    waves: list[tuple[int, int, float, float | None]],
    run: dict[str, Any],
    hidden_limit: float,
    isolate_errors: bool,
) -> None:
    world, batcher, calls = asyncio.run(
        run_waves(waves, hidden_limit=hidden_limit, isolate_errors=isolate_errors, **run)
    )
    assert not world.violations, world.violations
    for text, task, _, _ in calls:
        error = task.exception()
        if error is None:
            assert task.result() == text.id * 10, "a caller got someone else's result"
        elif isinstance(error, MemoryError):
            assert text.tokens > hidden_limit, "a text that fits alone ran out of memory"
        else:
            assert isinstance(error, DeadlineExceeded), error
    assert all(count == 1 for count in world.computed.values()), "a text computed twice"
    splits = [batch for batch in world.failed_calls if len(batch) > 1]
    stats = batcher.stats()
    assert stats.oom_splits == len(splits)
    if splits:
        assert stats.cost_ceiling is not None
        assert stats.cost_ceiling < max(world.cost(batch) for batch in splits)


def test_the_ceiling_is_learned_and_batches_stop_running_out_of_memory() -> None:
    """A steady stream over a model that fails above a hidden cost: after a few
    failures the batches fit, and the ceiling sits below the hidden cost."""
    waves = [(8, 16, 0.002, None)] * 150
    world, batcher, calls = asyncio.run(
        run_waves(
            waves,
            hidden_limit=100.0,
            batch_s=0.004,
            budget=512.0,
            mode="padded",
            max_batch_size=32,
            max_latency_ms=5.0,
        )
    )
    assert all(task.exception() is None for _, task, _, _ in calls)
    stats = batcher.stats()
    assert stats.cost_ceiling is not None and stats.cost_ceiling <= 100.0 * 1.05
    late = world.calls[len(world.calls) // 2 :]
    late_failures = [batch for batch in late if world.cost(batch) > 100.0]
    assert len(late_failures) <= len(late) // 16, "batches keep running out of memory"
