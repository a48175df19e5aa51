"""microbatch, for ``microbatch serve``: two ATTR kinds over the same workload.

* ``microbatch_server:service`` -- a ``Service`` with one process ``Stage`` (one worker).
* ``microbatch_server:predict`` -- a ``@microbatch.batch`` async function in the
  serving process (the model runs in a thread via ``asyncio.to_thread``).

Both: max batch 64, ``max_latency_ms=10`` (adaptive policy, the default). Run, from
this directory: ``microbatch serve microbatch_server:service --host 127.0.0.1 --port 0``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import microbatch

sys.path.insert(0, str(Path(__file__).parent))
from workloads import MAX_BATCH, MAX_WAIT_MS, Workload, load

SETTINGS = microbatch.BatchConfig(max_batch_size=MAX_BATCH, max_latency_ms=MAX_WAIT_MS)


class Model(microbatch.Model):
    """The workload in a worker process."""

    def setup(self, worker: microbatch.WorkerContext) -> None:
        self.workload = load()

    def predict(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.workload.predict(batch)


service = microbatch.Service(microbatch.Stage(Model, workers=1, batching=SETTINGS))

_workload: Workload | None = None


@microbatch.batch(max_batch_size=MAX_BATCH, max_latency_ms=MAX_WAIT_MS)
async def predict(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workload in the serving process, off the event loop."""
    global _workload
    if _workload is None:
        _workload = load()
    return await asyncio.to_thread(_workload.predict, bodies)
