"""Process stages under uvloop, the loop ``microbatch serve`` runs on.

uvloop makes every descriptor it watches non-blocking; the pipes to the workers carry
messages far larger than a pipe buffer, read and written a piece at a time as the pipe
allows, which must still arrive whole.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import uvloop

from microbatch import BatchConfig
from microbatch.pipeline import ProcessPool, Service, Stage
from tests.integration.pipeline_models import Expand, Identity

pytestmark = pytest.mark.timeout(120)


def test_messages_larger_than_the_pipe_buffer_arrive_whole_both_ways() -> None:
    async def main() -> tuple[list[list[float]], int]:
        stage = Stage(Identity, max_batch_size=8, max_latency_ms=5)
        async with Service(stage) as service:
            # about 300 KB pickled per item in each direction, 8 items per batch
            items = [[i + j / 7 for j in range(30_000)] for i in range(24)]
            results = await asyncio.gather(*(service.submit(item) for item in items))
            pool = service.pools[0]
            assert isinstance(pool, ProcessPool)
            for worker in pool._workers:  # the pipes uvloop watches: never blocking
                assert worker is not None and not os.get_blocking(worker.conn.fileno())
                assert not os.get_blocking(worker.out.fileno())
            return results, service.stats().stages[0].restarts

    results, restarts = uvloop.run(main())
    assert results == [[i + j / 7 for j in range(30_000)] for i in range(24)]
    assert restarts == 0


def test_numpy_results_larger_than_the_pipe_cross_a_process_stage() -> None:
    async def round_trip() -> tuple[list[Any], int]:
        settings = BatchConfig(max_batch_size=16, max_latency_ms=5)
        async with Service(Stage(Expand, batching=settings)) as service:
            back = await asyncio.gather(*(service.submit(x, timeout_s=60) for x in range(64)))
            return list(back), service.pools[0].restarts

    back, restarts = uvloop.run(round_trip())
    assert restarts == 0
    assert [(array.shape, float(array[-1, -1])) for array in back] == [
        ((64, 512), float(x)) for x in range(64)
    ]
