"""Issue 19, per-request timing: the ``Server-Timing`` header of predict responses
(queued, behind a running batch, model time, batch size per stage), computed from
the batcher's and the runner's own times; on by default, off with a setting."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from microbatch._batch_timing import record_batch
from microbatch.batcher import Batcher
from microbatch.config import BatchConfig
from microbatch.http import HttpApp, HttpConfig
from microbatch.testing import FakeClock
from microbatch.timing import BatchPart, Timing, accepts_timing, metric_name
from microbatch.types import BatchDone, BatchJob
from tests.http import models
from tests.http.conftest import serving
from tests.serve.test_server import running
from tests.timing.models import triple

_METRIC = re.compile(r'^([A-Za-z0-9!#$%&\'*+.^_`|~-]+)((?:;[a-z]+=(?:"[^"]*"|[0-9.]+))*)$')


def parse_server_timing(value: str) -> dict[str, dict[str, str]]:
    """``Server-Timing`` as ``{metric: {param: value}}``; fails on a malformed entry."""
    metrics: dict[str, dict[str, str]] = {}
    for entry in value.split(", "):
        match = _METRIC.match(entry)
        assert match is not None, f"malformed Server-Timing entry {entry!r} in {value!r}"
        params = {}
        for param in match.group(2).split(";")[1:]:
            key, _, given = param.partition("=")
            params[key] = given.strip('"')
        metrics[match.group(1)] = params
    return metrics


def stage_numbers(
    metrics: dict[str, dict[str, str]], stage: str
) -> tuple[float, float, float, int]:
    """One stage's queued, behind and model milliseconds, and its batch size."""
    size = re.search(r"size=(\d+)", metrics[f"{stage}.batch"]["desc"])
    assert size is not None
    return (
        float(metrics[f"{stage}.queue"]["dur"]),
        float(metrics[f"{stage}.behind"]["dur"]),
        float(metrics[f"{stage}.model"]["dur"]),
        int(size.group(1)),
    )


def assert_consistent(value: str, stages: list[str], max_batch_size: int) -> None:
    """Every stage present, parts within the total, batch sizes possible."""
    metrics = parse_server_timing(value)
    total = float(metrics["total"]["dur"])
    spent = 0.0
    for stage in stages:
        queued, behind, model, size = stage_numbers(metrics, stage)
        assert min(queued, behind, model) >= 0
        assert 1 <= size <= max_batch_size
        spent += queued + behind + model
    assert spent <= total + 0.01 * len(stages)  # each number is rounded to 0.01 ms


def test_header_renders_every_stage_and_the_total() -> None:
    timing = Timing(10.0)
    timing.record("embed", 0.001, 0.0005, 0.004, 8, 412.0)
    timing.stage = "two words"
    timing.record("ignored", 0.0, 0.0, 0.001, 1)
    metrics = parse_server_timing(timing.header(10.010))
    assert metrics["embed.queue"] == {"dur": "1.00"}
    assert metrics["embed.behind"] == {"dur": "0.50"}
    assert metrics["embed.model"] == {"dur": "4.00"}
    assert metrics["embed.batch"] == {"desc": "size=8 cost=412"}
    assert metrics["two_words.batch"] == {"desc": "size=1"}
    assert metrics["total"] == {"dur": "10.00"}
    assert timing.header_line(10.010).startswith(b"server-timing: embed.queue;dur=1.00")
    assert metric_name("") == "_" and metric_name("a/b é") == "a_b__"


def test_a_batchs_shared_part_makes_whole_entries_in_order_and_the_same_header() -> None:
    # record_batch keeps each item's latest entry as the batch's shared part and
    # its arrival; read back, the entries are whole and in order, and the header
    # told from the shared part is the one told from the whole entries.
    first = BatchPart("embed", 10.004, 0.0005, 0.004, 8, 412.0)
    second = BatchPart("rank", 10.010, 0.0, 0.002, 3, None)
    compact, whole = Timing(10.0), Timing(10.0)
    compact.add(first, 10.001)
    whole.record("embed", 0.003, 0.0005, 0.004, 8, 412.0)
    assert compact.header_line(10.02) == whole.header_line(10.02)
    compact.add(second, 10.011)  # arrived after the release: queued nothing
    whole.record("rank", 0.0, 0.0, 0.002, 3)
    assert compact.header(10.02) == whole.header(10.02)
    assert [entry.stage for entry in compact.stages] == ["embed", "rank"]
    assert compact.stages[0][2:] == whole.stages[0][2:]
    assert compact.stages[0].queued_s == pytest.approx(0.003)
    assert compact.stages[1].queued_s == 0.0
    assert compact.failure_value(10.03, "X") == whole.failure_value(10.03, "X")


@given(
    queued_ms=st.floats(-5.0, 5_000.0, allow_nan=False),
    total_ms=st.floats(0.0, 100_000.0, allow_nan=False),
)
def test_a_one_stage_header_writes_each_time_to_the_nearest_hundredth_of_a_ms(
    queued_ms: float, total_ms: float
) -> None:
    # The one-stage line (every request's) writes its times from whole numbers; each
    # is the time to 0.01 ms, a negative wait is 0, and the text is what %.2f writes
    # but at an exact tie.
    timing = Timing(10.0)
    timing.add(BatchPart("embed", 10.0 + queued_ms / 1e3, 0.0, 0.001, 4, None), 10.0)
    line = timing.header_line(10.0 + total_ms / 1e3)
    assert line.startswith(b"server-timing: ") and line.endswith(b"\r\n")
    metrics = parse_server_timing(line[len(b"server-timing: ") : -2].decode())
    for name, true_ms in (("embed.queue", max(queued_ms, 0.0)), ("total", total_ms)):
        written = metrics[name]["dur"]
        assert re.fullmatch(r"\d+\.\d\d", written)
        assert abs(float(written) - true_ms) <= 0.005 + 1e-6


def test_record_batch_shares_one_part_but_keeps_each_records_own_stage_name() -> None:
    plain, named = Timing(1.0), Timing(1.0, stage="mine")
    record_batch("stage", [(plain, 1.001), (named, 1.002)], 1.004, 1.005, 1.009, 2, None)
    assert plain.stages[0].stage == "stage" and named.stages[0].stage == "mine"
    assert plain.stages[0].queued_s == pytest.approx(0.003)
    assert named.stages[0].queued_s == pytest.approx(0.002)
    assert named.stages[0].behind_s == pytest.approx(0.001)
    assert named.stages[0].model_s == pytest.approx(0.004)


def test_a_predict_routes_record_starts_when_the_front_says_the_request_came_in() -> None:
    predictor = HttpApp(models.double, HttpConfig()).native_predictors()["/predict"]
    given = predictor.timing((), 12.5)  # the connection's own reading at the headers
    assert given is not None and given.start_s == 12.5
    before = time.monotonic()
    read = predictor.timing()
    assert read is not None and before <= read.start_s <= time.monotonic()


def test_only_servables_whose_submit_takes_timing_are_given_it() -> None:
    class Plain:
        async def submit(self, item: Any, *, deadline: float | None = None) -> Any:
            return item

    class Open:
        async def submit(self, item: Any, **options: Any) -> Any:
            return item

    assert accepts_timing(models.double) and accepts_timing(models.service)
    assert not accepts_timing(Plain()) and accepts_timing(Open())


class HeldRunner:
    """A runner whose batches end when the test says, at the times it says."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.jobs: list[tuple[BatchJob, float]] = []  # each batch and when it came
        self.done: list[asyncio.Future[BatchDone]] = []

    async def run(self, job: BatchJob) -> BatchDone:
        self.jobs.append((job, self.clock.now()))
        future: asyncio.Future[BatchDone] = asyncio.get_running_loop().create_future()
        self.done.append(future)
        return await future

    def running_since(self) -> float | None:
        return None


async def test_batcher_records_queued_behind_and_model_time_from_the_runners_report() -> None:
    clock = FakeClock(100.0)
    runner = HeldRunner(clock)
    config = BatchConfig(max_batch_size=2, max_latency_ms=1000, max_concurrent_batches=1)
    batcher: Batcher[int, int] = Batcher(runner=runner, clock=clock, config=config)
    batcher.name = "square"
    timings: dict[int, Timing | None] = {}
    arrived: dict[int, float] = {}
    tasks = {}
    for item in (1, 2, 3, 4, 5):
        timings[item] = None if item == 4 else Timing(clock.now())
        arrived[item] = clock.now()
        tasks[item] = asyncio.ensure_future(batcher.submit(item, timing=timings[item]))
        for _ in range(3):
            await asyncio.sleep(0)
        clock.advance(0.004)
    reports = {}
    for index in range(5):
        while len(runner.jobs) <= index and index < 5:
            if all(task.done() for task in tasks.values()):
                break
            await asyncio.sleep(0)
        if len(runner.jobs) <= index:
            break
        job, released = runner.jobs[index]
        started = max(clock.now(), released) + 0.001  # behind the batch before it
        clock.advance(started + 0.002 - clock.now())
        reports[index] = BatchDone([x * x for x in job.items], started, started + 0.002, job.units)
        runner.done[index].set_result(reports[index])
        await asyncio.sleep(0)
    assert {item: await task for item, task in tasks.items()} == {x: x * x for x in tasks}
    assert len(runner.jobs) > 1
    for index, (job, released) in enumerate(runner.jobs):
        done = reports[index]
        assert done.started_s is not None and done.finished_s is not None
        for item in job.items:
            timing = timings[item]
            if timing is None:
                continue
            (entry,) = timing.stages
            # released by a policy timer at its time: at or before the runner saw it
            assert 0 <= entry.queued_s <= released - arrived[item] + 1e-9
            assert entry.behind_s >= 0
            assert entry.queued_s + entry.behind_s == pytest.approx(done.started_s - arrived[item])
            assert entry.model_s == pytest.approx(done.finished_s - done.started_s)
            assert (entry.stage, entry.batch_size, entry.batch_cost) == ("square", job.units, None)
    await batcher.close()


async def test_cost_is_told_when_the_stage_has_a_cost_fn() -> None:
    clock = FakeClock()

    async def lengths(texts: list[str]) -> list[int]:
        clock.advance(0.003)  # the model's time, on the batcher's clock
        return [len(text) for text in texts]

    config = BatchConfig(max_batch_size=8, max_latency_ms=1, cost_fn=len)
    batcher: Batcher[str, int] = Batcher(lengths, config, clock=clock)
    timing = Timing(clock.now())
    task = asyncio.ensure_future(batcher.submit("abcd", timing=timing))
    for _ in range(3):
        await asyncio.sleep(0)
    clock.advance(0.01)
    assert await task == 4
    (entry,) = timing.stages
    assert entry.stage == "lengths" and entry.batch_size == 1 and entry.batch_cost == 4.0
    assert entry.model_s == pytest.approx(0.003)
    await batcher.close()


async def test_asgi_app_tells_server_timing_consistent_under_concurrency() -> None:
    async with serving(HttpApp(models.double)) as client:
        replies = await asyncio.gather(
            *(client.post("/predict", json={"x": x + 0.5}) for x in range(20))
        )
    for reply in replies:
        assert reply.status_code == 200
        assert_consistent(reply.headers["server-timing"], ["double"], 32)
    sizes = {
        stage_numbers(parse_server_timing(r.headers["server-timing"]), "double")[3] for r in replies
    }
    assert max(sizes) > 1  # twenty at once: some batches held several


async def test_a_thread_batched_function_tells_it_too() -> None:
    async with serving(HttpApp(triple)) as client:
        replies = await asyncio.gather(
            *(client.post("/predict", json={"x": x + 0.5}) for x in range(8))
        )
    for reply in replies:
        assert reply.status_code == 200
        assert_consistent(reply.headers["server-timing"], ["triple"], 32)


async def test_every_stage_of_a_pipeline_is_told_and_the_setting_turns_it_off() -> None:
    async with serving(HttpApp(models.make_two_stages())) as client:
        reply = await client.post("/predict", json={"x": 2.0})
    assert reply.status_code == 200
    assert_consistent(reply.headers["server-timing"], ["Double", "Describe"], 16)
    async with serving(HttpApp(models.double, HttpConfig(server_timing=False))) as client:
        reply = await client.post("/predict", json={"x": 2.0})
    assert reply.status_code == 200 and "server-timing" not in reply.headers


@pytest.mark.parametrize("workers", ["1", "2"])
def test_microbatch_serve_tells_it_on_its_fast_path_and_through_workers(workers: str) -> None:
    with running("tests.http.models:service", "--workers", workers) as server:
        reply = httpx.post(f"{server.url}/predict", json={"x": 2.0}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert_consistent(reply.headers["server-timing"], ["Double"], 32)
        _, _, model, _ = stage_numbers(
            parse_server_timing(reply.headers["server-timing"]), "Double"
        )
        assert model > 0  # the model sleeps in its worker process


def test_no_server_timing_flag_leaves_the_header_out() -> None:
    with running("tests.http.models:double", "--no-server-timing") as server:
        reply = httpx.post(f"{server.url}/predict", json={"x": 2.0}, timeout=30)
    assert reply.status_code == 200 and "server-timing" not in reply.headers
