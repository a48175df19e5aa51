"""Issue 19: ``Server-Timing`` on every response, failed ones too: the stages a
request finished, the stage it failed in with its time there (queued until shed or
expired, or its batch's time), the error's name and the total; on the ASGI app's
routes (predict, health, v2, OpenAI, streams) and on ``microbatch serve``'s fast
path, alone and under ``--workers``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from microbatch import Service, Stage
from microbatch.http import HttpApp, HttpConfig, Services
from microbatch.timing import Timing, failure_line, refused_value
from tests.http import models
from tests.http.conftest import serving
from tests.protocols.models import double, shout
from tests.serve.test_server import running
from tests.streams.models import Counter
from tests.timing.models import make_picky
from tests.timing.test_server_timing import parse_server_timing, stage_numbers

HANG_GUARD_S = 60.0


def failed(value: str) -> tuple[str, float, str, float]:
    """The failed metric's name, duration and error name, and the total."""
    metrics = parse_server_timing(value)
    (name,) = [name for name in metrics if name == "failed" or name.endswith(".failed")]
    in_stage = float(metrics[name].get("dur", "nan"))  # none without a record
    return name, in_stage, metrics[name]["desc"], float(metrics["total"]["dur"])


def test_a_failure_tells_its_finished_stages_the_stage_it_failed_in_and_the_rest() -> None:
    timing = Timing(10.0)
    timing.record("embed", 0.001, 0.002, 0.003, 4)
    timing.stage = "rank"
    value = timing.failure_value(10.5, "DeadlineExceeded").decode()
    metrics = parse_server_timing(value)
    assert stage_numbers(metrics, "embed") == (1.0, 2.0, 3.0, 4)
    # half a second in all, 6 ms of it in embed's batch: the rest went in rank
    assert metrics["rank.failed"] == {"dur": "494.00", "desc": "DeadlineExceeded"}
    assert metrics["total"] == {"dur": "500.00"}
    unnamed = Timing(1.0)
    assert unnamed.failure_value(1.25, "Overloaded") == (
        b'failed;dur=250.00;desc="Overloaded", total;dur=250.00'
    )
    assert refused_value(0.0015, 'a "quoted"\nname') == (
        b'failed;desc="a _quoted__name", total;dur=1.50'
    )


def test_the_failure_line_needs_no_record_and_keeps_a_trace_only_record_silent() -> None:
    assert failure_line(None, 0.002, 0.0, "NotReady") == (
        b'server-timing: failed;desc="NotReady", total;dur=2.00\r\n'
    )
    silent = Timing(0.0)
    silent.told = False
    assert failure_line(silent, 0.002, 1.0, "NotReady") == b""
    assert failure_line(Timing(0.0), 9.0, 0.001, "X").endswith(b"total;dur=1.00\r\n")


async def test_asgi_predict_failures_tell_the_stage_and_other_routes_tell_the_total() -> None:
    async with serving(HttpApp(make_picky())) as client:
        picked = await client.post("/predict", json={"x": -1.0})
        malformed = await client.post(
            "/predict", content=b"{", headers={"content-type": "application/json"}
        )
        missing = await client.get("/nowhere")
        live = await client.get("/health/live")
    assert picked.status_code == 422
    metrics = parse_server_timing(picked.headers["server-timing"])
    assert stage_numbers(metrics, "Double")[3] == 1 and stage_numbers(metrics, "Picky")[3] == 1
    name, in_stage, error, total = failed(picked.headers["server-timing"])
    assert (name, error) == ("Picky.failed", "ItemError") and 0 <= in_stage <= total
    assert malformed.status_code == 400
    assert failed(malformed.headers["server-timing"])[2] == "MalformedBody"
    assert missing.status_code == 404
    assert failed(missing.headers["server-timing"])[::2] == ("failed", "NotFound")
    assert live.status_code == 200
    assert set(parse_server_timing(live.headers["server-timing"])) == {"total"}


async def test_asgi_overload_and_deadline_tell_the_time_queued_until_shed_or_expired() -> None:
    async with serving(HttpApp(models.service)) as client:
        fine = await client.post("/predict", json={"x": 1.0})
    assert fine.status_code == 200
    app = HttpApp(Service(Stage(models.SlowDouble, mode="thread", max_batch_size=1, max_queue=1)))
    async with serving(app) as client:
        running_one = asyncio.ensure_future(client.post("/predict", json={"x": 1.0}))
        await asyncio.sleep(0.05)  # the first is in the model (0.3 s)
        short = {"x-request-timeout-ms": "100"}
        # one handed over behind it (run-ahead), one queued, one refused
        others = await asyncio.wait_for(
            asyncio.gather(
                *(client.post("/predict", json={"x": x}, headers=short) for x in (2.0, 3.0, 4.0))
            ),
            HANG_GUARD_S,
        )
        assert (await asyncio.wait_for(running_one, HANG_GUARD_S)).status_code == 200
    answers = {reply.status_code: reply for reply in others}
    assert set(answers) == {503, 504}
    name, in_stage, error, total = failed(answers[504].headers["server-timing"])
    assert (name, error) == ("SlowDouble.failed", "DeadlineExceeded")
    assert 0 < in_stage <= total  # queued until it expired: no stage finished
    name, in_stage, error, total = failed(answers[503].headers["server-timing"])
    assert (name, error) == ("SlowDouble.failed", "Overloaded") and in_stage <= total


async def test_protocol_routes_and_the_setting() -> None:
    async with serving(HttpApp(models.service)) as client:
        v2 = await client.post("/v2/models/nothing/infer", json={"inputs": []})
        v2_bad = await client.post(f"/v2/models/{models.service.name}/infer", content=b"{")
        embeddings = await client.post("/v1/embeddings", json={"input": "a", "model": "x"})
    for reply in (v2, v2_bad, embeddings):
        assert reply.status_code >= 400
        name, _, error, _ = failed(reply.headers["server-timing"])
        assert name == "failed" and error
    assert failed(v2_bad.headers["server-timing"])[2] == "TensorError"
    async with serving(HttpApp(models.service, HttpConfig(server_timing=False))) as client:
        missing = await client.get("/nowhere")
    assert missing.status_code == 404 and "server-timing" not in missing.headers


@pytest.fixture
def _counter_gate() -> Iterator[None]:
    Counter.gate = None
    yield
    if Counter.gate is not None:
        Counter.gate.set()
    Counter.gate = None


@pytest.mark.usefixtures("_counter_gate")
async def test_a_streams_head_tells_the_wait_for_its_first_chunk() -> None:
    app = HttpApp(Service(Stage(Counter, mode="thread", max_batch_size=4, max_queue=1)))
    async with serving(app) as client:
        reply = await client.post("/stream", json="a:2", headers={"accept": "text/event-stream"})
    assert reply.status_code == 200
    metrics = parse_server_timing(reply.headers["server-timing"])
    assert set(metrics) == {"first"} and float(metrics["first"]["dur"]) >= 0


async def _slow_scenario(url: str, started: Path) -> tuple[httpx.Response, list[httpx.Response]]:
    """One request in the 0.5 s model (which connects to the Unix socket ``started``
    as it starts), then three with a 300 ms deadline: one handed over behind it and
    one queued (both expire), one refused (the queue holds one)."""
    running = asyncio.Event()

    def told(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        running.set()
        writer.close()

    listening = await asyncio.start_unix_server(told, path=str(started))
    async with listening, httpx.AsyncClient(base_url=url, timeout=HANG_GUARD_S) as client:
        first = asyncio.ensure_future(client.post("/predict", json={"x": 1.0}))
        await asyncio.wait_for(running.wait(), HANG_GUARD_S)  # a loaded machine is slow
        short = {"x-request-timeout-ms": "300"}
        others = await asyncio.gather(
            *(client.post("/predict", json={"x": x}, headers=short) for x in (2.0, 3.0, 4.0))
        )
        return await first, list(others)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_microbatch_serve_tells_failures_on_its_fast_path_and_through_workers(
    workers: str, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    options = ("--workers", workers)
    with running(
        "tests.timing.models:slow", *options, env={"SLOW_STARTED": str(started)}
    ) as server:
        first, others = asyncio.run(_slow_scenario(server.url, started))
        bad = httpx.post(
            f"{server.url}/predict",
            json={"x": 1.0},
            headers={"x-request-timeout-ms": "soon"},
            timeout=HANG_GUARD_S,
        )
        malformed = httpx.post(
            f"{server.url}/predict",
            content=b"{",
            headers={"content-type": "application/json"},
            timeout=HANG_GUARD_S,
        )
    assert first.status_code == 200
    assert stage_numbers(parse_server_timing(first.headers["server-timing"]), "Slow")[3] == 1
    answers = {reply.status_code: reply for reply in others}
    assert set(answers) == {503, 504}, [reply.text for reply in others]
    name, in_stage, error, total = failed(answers[504].headers["server-timing"])
    assert (name, error) == ("Slow.failed", "DeadlineExceeded") and 0 < in_stage <= total
    name, in_stage, error, total = failed(answers[503].headers["server-timing"])
    assert (name, error) == ("Slow.failed", "Overloaded") and in_stage <= total
    assert bad.status_code == 400
    assert failed(bad.headers["server-timing"])[::2] == ("failed", "BadRequest")
    assert malformed.status_code == 400
    assert failed(malformed.headers["server-timing"])[2] == "MalformedBody"


async def test_several_services_tell_it_on_their_shared_routes_and_each_services_own() -> None:
    async with serving(Services([double, shout], HttpConfig())) as client:  # type: ignore[arg-type]
        live = await client.get("/health/live")
        missing = await client.get("/nowhere")
        own = await client.post("/double/predict", json={"x": 1.0})
    assert set(parse_server_timing(live.headers["server-timing"])) == {"total"}
    assert failed(missing.headers["server-timing"])[::2] == ("failed", "NotFound")
    assert own.status_code == 200
    assert stage_numbers(parse_server_timing(own.headers["server-timing"]), "double")[3] >= 1
