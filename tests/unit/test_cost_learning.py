"""With two workers, the cost model learns the model's true cost from the times the
runner reports (issue 14: one owner of running batches).

A fake runner simulates two workers, each running one batch and holding the next one
behind it, of a model costing ``a + b * n`` on a FakeClock; callers in a closed loop
send items of several sizes. The batcher learns from the reported start and finish
times and recovers ``a`` and ``b``. The guess it used to make (a batch handed over
started at ``max(handed over, last finish of any batch)``) is shown on the same
batches: with two workers the other worker's finish is not this batch's start, so
the guessed durations are too long and the fit is off.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field

from microbatch import AdaptivePolicy, Batcher, CostModel
from microbatch.testing import FakeClock
from microbatch.types import BatchDone, BatchJob

A_S = 0.010  # the model's fixed cost per batch
B_S = 0.001  # and per unit


@dataclass
class Item:
    size: int


@dataclass
class Worker:
    queue: deque[tuple[BatchJob, asyncio.Future[BatchDone]]] = field(default_factory=deque)
    started_s: float | None = None


class TwoWorkers:
    """Two workers of a model costing ``A_S + B_S * units``; each holds the batch it
    runs and the next, and reports when it really started and finished each."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.workers = [Worker(), Worker()]
        self.handed: dict[int, float] = {}
        self.last_finish_s = float("-inf")
        self.guessed = CostModel()  # what the old guess would have learned
        self.most_held = 0

    def running_since(self) -> float | None:
        starts = [w.started_s for w in self.workers if w.started_s is not None]
        return min(starts, default=None)

    async def run(self, job: BatchJob) -> BatchDone:
        future: asyncio.Future[BatchDone] = asyncio.get_running_loop().create_future()
        self.handed[id(job)] = self.clock.now()
        worker = min(self.workers, key=lambda w: len(w.queue))
        worker.queue.append((job, future))
        self.most_held = max(self.most_held, len(worker.queue))
        if len(worker.queue) == 1:
            self._start(worker)
        return await future

    def _start(self, worker: Worker) -> None:
        job, _ = worker.queue[0]
        worker.started_s = self.clock.now()
        self.clock.call_at(worker.started_s + A_S + B_S * job.units, lambda: self._end(worker))

    def _end(self, worker: Worker) -> None:
        job, future = worker.queue.popleft()
        started, finished = worker.started_s, self.clock.now()
        assert started is not None
        handed = self.handed.pop(id(job))
        self.guessed.observe(job.units, finished - max(handed, self.last_finish_s))
        self.last_finish_s = finished
        worker.started_s = None
        future.set_result(BatchDone(list(job.items), started, finished, job.units))
        if worker.queue:
            self._start(worker)


async def caller(batcher: Batcher[Item, Item], clock: FakeClock, rng: random.Random) -> None:
    while True:
        await batcher.submit(Item(rng.randint(1, 4)))
        await clock.sleep(rng.uniform(0.0, 0.004))


def within(value: float, true: float, share: float = 0.10) -> bool:
    return abs(value - true) <= share * true


async def test_two_workers_teach_the_true_cost_within_ten_percent() -> None:
    clock = FakeClock(100.0)
    runner = TwoWorkers(clock)
    batcher: Batcher[Item, Item] = Batcher(
        runner=runner,
        clock=clock,
        max_batch_size=32,
        max_latency_ms=50,
        max_concurrent_batches=2,
        size_fn=lambda item: item.size,
    )
    rng = random.Random(14)
    callers = [asyncio.create_task(caller(batcher, clock, rng)) for _ in range(48)]
    for _ in range(20_000):
        for _ in range(5):
            await asyncio.sleep(0)
        if batcher.stats().batches >= 400:
            break
        next_timer = clock.next_timer()
        assert next_timer is not None, "nothing scheduled: a hang"
        clock.advance(max(next_timer - clock.now(), 0.0))
    for task in callers:
        task.cancel()
    await asyncio.gather(*callers, return_exceptions=True)

    stats = batcher.stats()
    assert stats.batches >= 400 and len(stats.batch_sizes) > 3  # sizes vary: a and b apart
    assert runner.most_held == 2  # each worker ran one batch and held the next
    policy = batcher.policy
    assert isinstance(policy, AdaptivePolicy)
    learned = policy.cost
    assert within(learned.fixed_s, A_S) and within(learned.per_unit_s, B_S), (
        learned.fixed_s,
        learned.per_unit_s,
    )
    # The old guess, on the very same batches, is more than 10% off.
    guessed = runner.guessed
    assert not (within(guessed.fixed_s, A_S) and within(guessed.per_unit_s, B_S)), (
        guessed.fixed_s,
        guessed.per_unit_s,
    )
