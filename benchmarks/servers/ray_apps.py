"""The Ray Serve contenders of ``benchmarks/ray_serving.py``, on the simulated accelerator.

* ``service``: microbatch's ``Service`` with one ``Stage`` (one model, max batch 64,
  ``max_latency_ms=10``, adaptive policy), deployed with ``microbatch.ray``;
* ``ServeBatched``: Ray Serve's own ``@serve.batch`` with the same settings
  (``max_batch_size=64``, ``batch_wait_timeout_s=0.01``, one batch at a time).

Both run the model in a thread off the replica's event loop (microbatch's stage
thread, or ``asyncio.to_thread`` under ``@serve.batch``). Each replica process counts
its batches into its own file under ``BENCH_COUNTER_DIR`` (the mean batch size).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from ray import serve
from starlette.requests import Request
from workloads import MAX_BATCH, MAX_WAIT_MS, Workload

import microbatch


def counted_workload() -> Workload:
    """The ``sim`` workload, counting into this process's own counter file."""
    directory = os.environ.get("BENCH_COUNTER_DIR")
    path = str(Path(directory) / f"{os.getpid()}.count") if directory else None
    return Workload("sim", path)


class Model(microbatch.Model):
    """The workload as a microbatch stage."""

    def setup(self, worker: microbatch.WorkerContext) -> None:
        self.workload = counted_workload()

    def predict(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.workload.predict(batch)


service = microbatch.Service(
    microbatch.Stage(Model, max_batch_size=MAX_BATCH, max_latency_ms=MAX_WAIT_MS)
)


class ServeBatched:
    """The workload behind ``@serve.batch`` (wrap with ``serve.deployment``)."""

    def __init__(self) -> None:
        self.workload = counted_workload()

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=MAX_WAIT_MS / 1000)
    async def predict(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.workload.predict, bodies)

    async def __call__(self, request: Request) -> dict[str, Any]:
        return await self.predict(await request.json())
