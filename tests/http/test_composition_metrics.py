"""The batch-composition metrics: padding efficiency, batch cost, OOM splits, ceiling."""

from __future__ import annotations

from dataclasses import replace

from microbatch import batch
from microbatch.http import app
from microbatch.http.metrics import ServiceCollector
from microbatch.policy import QueueState
from microbatch.stats import ServiceStats, StageStats, StatsRecorder
from tests.http.conftest import serving


def test_composition_metrics_come_from_the_stage_stats() -> None:
    recorder = StatsRecorder()
    recorder.released(4, [0.001] * 4)
    recorder.costed(400.0, 100.0)  # a padded batch of 400 with 100 useful
    recorder.oom_splits = 3
    recorder.cost_ceiling = 250.0
    costed = recorder.snapshot(QueueState())
    plain = replace(StatsRecorder().snapshot(QueueState()))
    stats = ServiceStats(
        ready=True,
        draining=False,
        in_flight=0,
        stages=(StageStats("embed", 1, 1, 0, costed), StageStats("plain", 1, 1, 0, plain)),
    )
    families = {family.name: family for family in ServiceCollector(lambda: stats).collect()}
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for name in (
            "microbatch_padding_efficiency",
            "microbatch_batch_cost",
            "microbatch_oom_splits",
            "microbatch_batch_cost_ceiling",
        )
        for sample in families[name].samples
    }
    embed = (("stage", "embed"),)
    assert samples[("microbatch_padding_efficiency", embed)] == 0.25
    assert samples[("microbatch_batch_cost_count", embed)] == 1.0
    assert samples[("microbatch_batch_cost_sum", embed)] == 400.0
    assert samples[("microbatch_oom_splits_total", embed)] == 3.0
    assert samples[("microbatch_batch_cost_ceiling", embed)] == 250.0
    # A stage without cost_fn has no cost samples, and no ceiling before an OOM.
    plain_stage = (("stage", "plain"),)
    assert ("microbatch_padding_efficiency", plain_stage) not in samples
    assert ("microbatch_batch_cost_ceiling", plain_stage) not in samples
    assert samples[("microbatch_oom_splits_total", plain_stage)] == 0.0


async def test_an_item_over_the_cost_budget_is_answered_422() -> None:
    @batch(cost_fn=len, max_batch_cost=8, max_latency_ms=1)
    def upper(texts: list[str]) -> list[str]:
        return [text.upper() for text in texts]

    async with serving(app(upper)) as client:
        fits = await client.post("/predict", json="short")
        too_long = await client.post("/predict", json="far too long a text")
    assert fits.status_code == 200 and fits.json() == "SHORT"
    assert too_long.status_code == 422
    assert "exceeds max_batch_cost=8" in too_long.text
