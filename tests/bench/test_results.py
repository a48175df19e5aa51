"""Summaries of a run: percentiles, counts, batch sizes from /metrics, warnings, the table."""

from __future__ import annotations

import math

import pytest

from microbatch.bench import (
    BenchPlan,
    BenchReport,
    Endpoint,
    RunResult,
    Tally,
    mean_batch_sizes,
    parse_batch_totals,
    percentile,
    to_json,
    to_text,
)
from microbatch.bench.runner import warnings_for
from microbatch.http.metrics import HttpMetrics
from microbatch.stats import QUEUE_WAIT_BUCKETS_S, BatcherStats, ServiceStats, StageStats


def test_nearest_rank_percentiles() -> None:
    ordered = [float(i) for i in range(1, 101)]
    assert percentile(ordered, 50) == 50.0
    assert percentile(ordered, 99) == 99.0
    assert percentile(ordered, 100) == 100.0
    assert percentile([7.0], 1) == 7.0
    assert math.isnan(percentile([], 50))


def _tally() -> Tally:
    tally = Tally()
    for i in range(90):
        tally.reply(200, (i + 1) / 1000)
    for _ in range(6):
        tally.reply(503, 0.5)
    tally.reply(404, 0.001)
    tally.fail("timeout")
    tally.fail("closed")
    return tally


def test_a_run_result_counts_add_up() -> None:
    run = RunResult.from_tally(_tally(), mode="closed", concurrency=8, elapsed_s=2.0, cpu_s=0.5)
    assert run.requests == 99
    assert run.replies == 97
    assert run.ok == 90
    assert run.errors == {"404": 1, "503": 6, "closed": 1, "timeout": 1}
    assert run.ok + sum(run.errors.values()) == run.requests
    assert run.req_per_s == 97 / 2.0
    assert run.ok_per_s == 45.0
    assert run.client_cpu == 0.25
    latency = run.latency_ms
    assert latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"] == 500.0
    assert run.to_json()["latency_ms"]["max"] == 500.0


def test_a_run_without_replies_has_no_latencies() -> None:
    tally = Tally()
    tally.fail("connect")
    run = RunResult.from_tally(tally, mode="open", rate=10.0, elapsed_s=1.0, cpu_s=0.0)
    assert all(math.isnan(value) for value in run.latency_ms.values())
    assert run.to_json()["latency_ms"]["p50"] is None
    assert run.label == "rate=10/s"


def _metrics_text(sizes: dict[str, dict[int, int]]) -> str:
    def batching(counts: dict[int, int]) -> BatcherStats:
        batches, items = sum(counts.values()), sum(s * n for s, n in counts.items())
        return BatcherStats(
            queued=0,
            in_flight=0,
            batches=batches,
            items=items,
            mean_batch_size=items / max(batches, 1),
            batch_sizes=counts,
            queue_wait_p50_ms=0.0,
            queue_wait_p90_ms=0.0,
            queue_wait_p99_ms=0.0,
            queue_wait_counts=(0,) * (len(QUEUE_WAIT_BUCKETS_S) + 1),
            queue_wait_sum_s=0.0,
            expired=0,
            cancelled=0,
            rejected=0,
            failed=0,
        )

    stages = tuple(StageStats(name, 1, 1, 0, batching(c)) for name, c in sizes.items())
    stats = ServiceStats(ready=True, draining=False, in_flight=0, stages=stages)
    return HttpMetrics(lambda: stats).render().decode()


def test_mean_batch_sizes_come_from_the_histogram_microbatch_serve_exports() -> None:
    before = parse_batch_totals(_metrics_text({"tokenize": {1: 4}, "encode": {2: 2}}))
    after = parse_batch_totals(
        _metrics_text({"tokenize": {1: 4, 8: 2}, "encode": {2: 2, 16: 1, 32: 1}, "idle": {}})
    )
    assert before == {"tokenize": (4.0, 4.0), "encode": (2.0, 4.0)}
    assert mean_batch_sizes(before, after) == {"tokenize": 8.0, "encode": 24.0}
    assert parse_batch_totals("# nothing here\n") == {}


def test_warnings_name_the_run_and_the_cause() -> None:
    busy = RunResult.from_tally(_tally(), mode="closed", concurrency=64, elapsed_s=1.0, cpu_s=0.95)
    failing = Tally()
    failing.reply(422, 0.001)
    failing.unsent = 5
    bad = RunResult.from_tally(failing, mode="open", rate=500.0, elapsed_s=1.0, cpu_s=0.1)
    warnings = warnings_for([busy, bad], max_outstanding=16)
    assert len(warnings) == 3
    assert warnings[0].startswith("c=64: the load generator used 95% of a CPU core")
    assert "5 arrivals were never sent because 16 requests" in warnings[1]
    assert "no request succeeded (1 x 422)" in warnings[2]


def test_the_table_and_json_show_every_run() -> None:
    plan = BenchPlan(Endpoint("127.0.0.1", 8000), concurrency=(8,), rates=(100.0,))
    runs = [
        RunResult.from_tally(
            _tally(),
            mode="closed",
            concurrency=8,
            elapsed_s=2.0,
            cpu_s=0.2,
            mean_batch_size={"a": 2.0, "b": 3.5},
        ),
        RunResult.from_tally(Tally(), mode="open", rate=100.0, elapsed_s=1.0, cpu_s=0.0),
    ]
    report = BenchReport(
        "http://127.0.0.1:8000/predict", "1 body from --body", plan, "uvloop", runs, ["w"]
    )
    text = to_text(report)
    assert "c=8" in text and "rate=100/s" in text
    assert "a 2.0, b 3.5" in text
    assert "503: 6" in text and "timeout: 1" in text
    assert text.endswith("warning: w")
    data = to_json(report)
    assert [run["mode"] for run in data["runs"]] == ["closed", "open"]
    assert data["warnings"] == ["w"]


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"concurrency": (), "rates": ()}, "nothing to run"),
        ({"concurrency": (0,)}, "concurrency"),
        ({"rates": (-1.0,)}, "rates"),
        ({"duration_s": 0.0}, "duration_s"),
        ({"warmup_s": -1.0}, "warmup_s"),
        ({"timeout_s": math.inf}, "timeout_s"),
        ({"max_outstanding": 0}, "max_outstanding"),
    ],
)
def test_a_bad_plan_names_the_setting(settings: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        BenchPlan(Endpoint("127.0.0.1", 8000), **settings)  # type: ignore[arg-type]
