"""Out-of-memory splitting in worker processes and threads: a model that raises
MemoryError above a hidden batch cost. Every item is answered, the ceiling is
learned, and later batches fit (asserted on counts, never on timing)."""

from __future__ import annotations

import asyncio

import pytest

from microbatch.pipeline import Service, Stage
from tests.integration.oom_models import RunsOutAbove

pytestmark = pytest.mark.timeout(120)

HIDDEN = 40


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_a_model_that_runs_out_of_memory_is_split_and_the_ceiling_learned(
    mode: str,
) -> None:
    service = Service(
        Stage(
            RunsOutAbove,
            mode=mode,  # type: ignore[arg-type]
            args=(HIDDEN,),
            max_batch_size=64,
            max_latency_ms=20,
            cost_fn=float,
            max_batch_cost=1000,
            batch_cost="sum",
        ),
        examples=[1],
    )
    async with service:
        first = await asyncio.gather(*(service.submit(3) for _ in range(200)))
        learned = service.stats().stages[0].batching
        second = await asyncio.gather(*(service.submit(3) for _ in range(200)))
        after = service.stats().stages[0].batching
    assert first == [6] * 200 and second == [6] * 200  # every item answered, its own
    assert learned.oom_splits >= 1
    assert learned.cost_ceiling is not None and learned.cost_ceiling <= HIDDEN
    # Throughput recovers: the second wave's batches fit (a probe may fail once).
    assert after.oom_splits - learned.oom_splits <= 2
    assert after.batches - learned.batches >= 200 * 3 // HIDDEN
