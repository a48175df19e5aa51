"""Process stages on uvloop, the loop ``microbatch serve`` gets from uvicorn.

uvloop makes a file descriptor non-blocking when it is watched. A worker's pipe
read in that mode fails half-way through a result that does not fit the pipe at
once, which used to look like a dead worker (the embedding example under load).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from microbatch import BatchConfig
from microbatch.pipeline import Service, Stage
from tests.integration.pipeline_models import Expand

uvloop = pytest.importorskip("uvloop")
pytestmark = pytest.mark.timeout(120)


def test_results_larger_than_the_pipe_cross_a_process_stage_on_uvloop() -> None:
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
