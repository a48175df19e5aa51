"""What the reliability tests serve (``tests.reliability.models:NAME``).

Importable and light (no numpy): workers are spawned and import this module, and a
restarted worker should be back quickly. A worker appends the id of every item its
model computes, with the time it started (``time.monotonic()``, the same clock in
every process), to the file named by ``$MICROBATCH_RELIABILITY_LOG``: a test can tell
which items were computed, and when.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import msgspec

import microbatch
from microbatch import Model, Service, Stage, WorkerContext

LOG_ENV = "MICROBATCH_RELIABILITY_LOG"
MARKER_ENV = "MICROBATCH_RELIABILITY_MARKER"
GATE_ENV = "MICROBATCH_RELIABILITY_GATE"


class Job(msgspec.Struct, frozen=True):
    """One request. ``poison``: the model raises for any batch holding it (bisection
    must isolate it); ``bad``: the model returns an error at its place."""

    id: int
    poison: bool = False
    bad: bool = False


class Done(msgspec.Struct, frozen=True):
    id: int


class Work(Model):
    """Sleeps ``batch_s`` per batch, logs the ids it computes, answers ``Done(id)``."""

    def __init__(self, batch_s: float = 0.0) -> None:
        self.batch_s = batch_s

    def setup(self, worker: WorkerContext) -> None:
        path = os.environ.get(LOG_ENV)
        self.log = None if path is None else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def predict(self, batch: list[Job]) -> list[Done]:
        if self.log is not None:
            now = time.monotonic()
            os.write(self.log, "".join(f"{job.id} {now}\n" for job in batch).encode())
        if self.batch_s:
            time.sleep(self.batch_s)
        if any(job.poison for job in batch):
            raise ValueError("poison in this batch (secret detail: /srv/model/weights.bin)")
        results: list[Any] = [
            KeyError(f"bad item {job.id}") if job.bad else Done(job.id) for job in batch
        ]
        return results


class DiesInSetupOnceMarked(Work):
    """:class:`Work` that sets up until the file ``$MICROBATCH_RELIABILITY_MARKER``
    exists; from then on each setup appends its time to that file and crashes."""

    def setup(self, worker: WorkerContext) -> None:
        marker = os.environ.get(MARKER_ENV)
        if marker is not None and os.path.exists(marker):
            with open(marker, "a") as attempts:
                attempts.write(f"{time.monotonic()}\n")
            os._exit(3)
        super().setup(worker)


class GatedWork(Work):
    """:class:`Work` whose first batch waits for the gate: the named pipe
    ``$MICROBATCH_RELIABILITY_GATE``, opened for reading, which blocks until the test
    opens it for writing (so every item behind the first stays queued until then)."""

    def setup(self, worker: WorkerContext) -> None:
        super().setup(worker)
        self.gate = os.environ.get(GATE_ENV)

    def predict(self, batch: list[Job]) -> list[Done]:
        if self.gate is not None:
            with open(self.gate, "rb") as gate:
                gate.read()
            self.gate = None
        return super().predict(batch)


WARM = [Job(-1)]

storm = Service(
    Stage(Work, workers=2, max_batch_size=64, max_latency_ms=5, args=(0.2,)), examples=WARM
)
"""Two workers, 200 ms per batch of up to 64: the kill storm (200 clients keep it
busy without taking all the CPU a restarting worker needs)."""

steady = Service(
    Stage(Work, workers=2, max_batch_size=32, max_latency_ms=5, args=(0.02,)), examples=WARM
)
"""Two workers, 20 ms per batch: the soak."""

poison = Service(Stage(Work, workers=2, max_batch_size=32, max_latency_ms=5), examples=WARM)
"""Batches of up to 32 with bad items among them."""

fragile = Service(Stage(DiesInSetupOnceMarked, setup_attempts=2), examples=WARM)
"""One worker that dies in setup once the marker file exists."""

fragile_poison = Service(
    Stage(DiesInSetupOnceMarked, workers=2, max_batch_size=32, max_latency_ms=5), examples=WARM
)
"""As ``poison``, but once the marker file exists a killed worker stays down."""

blocked = Service(
    Stage(Work, workers=1, max_batch_size=100, max_latency_ms=1, args=(2.0,)),
    examples=WARM,
    max_in_flight=100,
)
"""A model blocked 2 s per batch; at most 100 items inside."""

limited = Service(
    Stage(Work, workers=1, max_batch_size=8, max_latency_ms=2, args=(0.04,)),
    examples=WARM,
    max_in_flight=40,
)
"""Capacity 200 items/s (8 per 40 ms); at most 40 items inside."""

slow = Service(Stage(Work, workers=1, max_batch_size=1, max_latency_ms=0, args=(0.2,)))
"""One item at a time, 200 ms each: the deadline test."""

gated = Service(Stage(GatedWork, workers=1, max_batch_size=1, max_latency_ms=0, args=(0.2,)))
"""As ``slow``, but the first item waits for the test to open the gate."""

draining = Service(
    Stage(Work, workers=2, max_batch_size=64, max_latency_ms=5, args=(0.5,)),
    examples=WARM,
    grace_s=30,
)
"""Half a second per batch: requests stay in flight across SIGTERM."""

queueing = Service(Stage(Work, workers=1, max_batch_size=8, max_latency_ms=2, args=(0.05,)))
"""Eight items per 50 ms: a queue forms under 100 clients (the disconnect test)."""


@microbatch.batch(max_batch_size=64, max_latency_ms=1)
async def echo(items: list[Any]) -> list[Any]:
    """Any JSON in, the same out, 10 ms per batch (an untyped target decodes whatever
    it is sent)."""
    await asyncio.sleep(0.01)
    return items
