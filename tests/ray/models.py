"""What the Ray tests deploy. Module level: replicas import it by name (the test
process's working directory, the repository root, is on every Ray worker's path)."""

from __future__ import annotations

import asyncio
import time

import msgspec
import ray

import microbatch
from microbatch import Model, Service, Stage, WorkerContext

GATE_NAME = "microbatch-test-gate"
NAMESPACE = "microbatch-tests"
POISON = 13.0
SLOW = 7.0


class Point(msgspec.Struct):
    x: float


class Tagged(msgspec.Struct):
    """The answer, and which replica computed it."""

    y: float
    replica: str


def replica_name() -> str:
    """The Ray actor name of the replica this code runs in."""
    return str(ray.get_runtime_context().get_actor_name())


class Double(Model):
    """``x -> 2x``; x == 13 fails for that item only; a batch holding x == 7 takes 1 s."""

    def setup(self, worker: WorkerContext) -> None:
        self.replica = replica_name()

    def predict(self, batch: list[Point]) -> list[Tagged]:
        if any(point.x == SLOW for point in batch):
            time.sleep(1.0)
        if any(point.x == POISON for point in batch):
            raise ValueError("poison")
        return [Tagged(2 * point.x, self.replica) for point in batch]


service = Service(Stage(Double, max_batch_size=32, max_latency_ms=5), examples=[Point(1.0)])


@ray.remote(num_cpus=0)
class Gate:
    """Holds every batch until opened, and tells which replica holds which items."""

    def __init__(self) -> None:
        self.arrived: dict[str, list[float]] = {}
        self.opened = asyncio.Event()
        self.changed = asyncio.Condition()

    async def arrive(self, replica: str, xs: list[float]) -> None:
        async with self.changed:
            self.arrived.setdefault(replica, []).extend(xs)
            self.changed.notify_all()
        await self.opened.wait()

    async def arrivals(self, count: int) -> dict[str, list[float]]:
        """Once ``count`` items arrived in all: which replica holds which."""
        async with self.changed:
            await self.changed.wait_for(lambda: sum(map(len, self.arrived.values())) >= count)
        return self.arrived

    def open(self) -> None:
        self.opened.set()


class Held(Model):
    """``x -> 2x``, each batch held at the named gate until the test opens it."""

    def __init__(self, gate: str = GATE_NAME) -> None:
        self.gate_name = gate

    def setup(self, worker: WorkerContext) -> None:
        self.replica = replica_name()
        self.gate = ray.get_actor(self.gate_name, namespace=NAMESPACE)

    def predict(self, batch: list[float]) -> list[Tagged]:
        if batch:
            ray.get(self.gate.arrive.remote(self.replica, list(batch)))
        return [Tagged(2 * x, self.replica) for x in batch]


# 16 worker threads per replica: every item of the test reaches the model (and the gate).
held = Service(Stage(Held, workers=16, max_batch_size=64, max_latency_ms=1))


@microbatch.batch(max_batch_size=16, max_latency_ms=2)
async def triple(xs: list[int]) -> list[int]:
    """A batched function rather than a Service."""
    return [3 * x for x in xs]
