"""Streams over HTTP: the three framings through the ASGI app in-process, then end
to end against ``microbatch serve`` with httpx streaming (a client that leaves
mid-stream, SIGTERM with a stream open)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import msgspec
import pytest

from microbatch import Model, Service, Stage
from microbatch.http import HttpApp
from tests.http.conftest import serving, serving_natively
from tests.serve.test_server import running
from tests.stream_exchange import check_stream_exchange

from .models import Counter, Name

HANG_GUARD_S = 60.0
SSE, NDJSON, MSGPACK = "text/event-stream", "application/x-ndjson", "application/msgpack"


Serve = Callable[[HttpApp], AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture(params=["asgi", "native"])
def serve(request: pytest.FixtureRequest) -> Serve:
    """Each in-process test twice: through the ASGI app, and through ``microbatch
    serve``'s own connection layer on 127.0.0.1 (streams written without ASGI)."""
    return serving if request.param == "asgi" else serving_natively


def counter_app() -> HttpApp:
    return HttpApp(Service(Stage(Counter, mode="thread", max_batch_size=4, max_queue=1)))


def sse_events(body: str) -> list[tuple[str, Any]]:
    events = []
    for block in body.split("\n\n"):
        if not block:
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


async def test_server_sent_events(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        reply = await client.post("/stream", json="a:3", headers={"accept": "text/event-stream"})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/event-stream"
    assert sse_events(reply.text) == [
        ("chunk", "a-0"),
        ("chunk", "a-1"),
        ("chunk", "a-2"),
        ("end", {"status": "complete", "chunks": 3}),
    ]


async def test_newline_delimited_json_and_msgpack(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        ndjson = await client.post(
            "/stream", json="b:2", headers={"accept": "application/x-ndjson"}
        )
        packed = await client.post("/stream", json="c:1", headers={"accept": "application/msgpack"})
    assert [json.loads(line) for line in ndjson.text.splitlines()] == [
        {"chunk": "b-0"},
        {"chunk": "b-1"},
        {"end": {"status": "complete", "chunks": 2}},
    ]
    decoder = msgspec.msgpack.Decoder()
    first = msgspec.msgpack.encode({"chunk": "c-0"})
    assert packed.content.startswith(first)
    assert decoder.decode(packed.content[len(first) :]) == {
        "end": {"status": "complete", "chunks": 1}
    }


async def test_predict_streams_when_asked_to(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        streamed = await client.post(
            "/predict", json="d:2", headers={"accept": "text/event-stream"}
        )
        whole = await client.post("/predict", json="d:2")
    assert [event for event, _ in sse_events(streamed.text)] == ["chunk", "chunk", "end"]
    assert whole.json() == ["d-0", "d-1"]


async def test_an_error_after_the_first_chunk_is_the_final_event(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        reply = await client.post("/stream", json="e:5:fail@2")
    assert reply.status_code == 200
    assert sse_events(reply.text) == [
        ("chunk", "e-0"),
        ("chunk", "e-1"),
        ("error", {"error": "ItemError", "message": "e failed at step 2", "status": 422}),
    ]


async def test_an_error_before_the_first_chunk_is_its_status(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        failed = await client.post("/stream", json="f:5:fail@0")
        Counter.gate = threading.Event()
        late = await client.post("/stream", json="g:2", headers={"x-first-chunk-timeout-ms": "50"})
        Counter.gate.set()
    assert failed.status_code == 422
    assert failed.json()["message"] == "f failed at step 0"
    assert late.status_code == 504
    assert late.json()["error"] == "DeadlineExceeded"


async def test_a_deadline_after_the_first_chunk_is_an_error_event(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        reply = await client.post("/stream", json="pid", headers={"x-request-timeout-ms": "100"})
    events = sse_events(reply.text)
    assert reply.status_code == 200 and events[0][0] == "chunk"
    assert events[-1][0] == "error" and events[-1][1]["status"] == 504
    assert all(event == "chunk" for event, _ in events[:-1])


async def test_overload_is_503_before_the_stream_starts(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        Counter.gate = threading.Event()
        running = asyncio.ensure_future(client.post("/stream", json="h:1"))
        await asyncio.sleep(0.1)  # its first step is held at the gate
        waiting = asyncio.ensure_future(client.post("/stream", json="w:1"))  # max_queue 1
        await asyncio.sleep(0.05)
        refused = await client.post("/stream", json="x:1")
        Counter.gate.set()
        replies = await asyncio.gather(running, waiting)
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert all(reply.status_code == 200 for reply in replies)


class OneShot(Model):
    def predict(self, batch: list[int]) -> list[int]:
        return batch


async def test_no_stream_route_for_a_model_that_does_not_stream(serve: Serve) -> None:
    async with serve(HttpApp(Service(Stage(OneShot, mode="thread")))) as client:
        assert (await client.post("/stream", json=1)).status_code == 404


# -- against a real server ------------------------------------------------------------


def test_end_to_end_with_httpx_streaming_and_a_client_that_leaves() -> None:
    with (
        running("tests.streams.served:service", "--log-level", "warning") as server,
        httpx.Client(base_url=server.url, timeout=HANG_GUARD_S) as client,
    ):
        check_stream_exchange(client)
        metrics = client.get("/metrics").text
        assert "microbatch_stream_chunks_total" in metrics


def test_sigterm_lets_an_open_stream_finish() -> None:
    with (
        running("tests.streams.served:slow", "--log-level", "warning") as server,
        httpx.Client(base_url=server.url, timeout=HANG_GUARD_S) as client,
        client.stream(
            "POST", "/stream", json=40, headers={"accept": "application/x-ndjson"}
        ) as reply,
    ):
        messages = []
        for line in reply.iter_lines():
            if not line:
                continue
            messages.append(json.loads(line))
            if len(messages) == 1:
                server.process.send_signal(signal.SIGTERM)
        assert messages == [{"chunk": k} for k in range(40)] + [
            {"end": {"status": "complete", "chunks": 40}}
        ]
        assert server.process.wait(HANG_GUARD_S) == 0


async def test_stream_metrics(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        await client.post("/stream", json="a:3")
        await client.post("/stream", json="b:2:fail@1")
        text = (await client.get("/metrics")).text
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("microbatch_stream", "microbatch_active", "microbatch_step"))
    }
    stage = 'stage="Counter"'
    assert samples[f"microbatch_stream_chunks_total{{{stage}}}"] == 4
    assert samples[f'microbatch_streams_total{{outcome="completed",{stage}}}'] == 1
    assert samples[f'microbatch_streams_total{{outcome="failed",{stage}}}'] == 1
    assert samples[f"microbatch_active_streams{{{stage}}}"] == 0
    assert samples[f"microbatch_stream_first_chunk_seconds_count{{{stage}}}"] == 2
    assert samples[f"microbatch_stream_between_chunks_seconds_count{{{stage}}}"] == 2
    assert samples[f"microbatch_stream_chunks_per_stream_sum{{{stage}}}"] == 4
    assert samples[f"microbatch_steps_total{{{stage}}}"] >= 3


async def test_the_stream_route_is_documented(serve: Serve) -> None:
    async with serve(counter_app()) as client:
        document = (await client.get("/openapi.json")).json()
    operation = document["paths"]["/stream"]["post"]
    assert operation["operationId"] == "stream"
    assert set(operation["responses"]["200"]["content"]) == {
        "text/event-stream",
        "application/x-ndjson",
        "application/msgpack",
    }
    assert "X-First-Chunk-Timeout-Ms" in [p["name"] for p in operation["parameters"]]


async def test_a_pipeline_streams_its_whole_path_and_its_streaming_stage(serve: Serve) -> None:
    pipeline = Service(Stage(Name, mode="thread"), Stage(Counter, mode="thread"))
    async with serve(HttpApp(pipeline)) as client:
        whole = await client.post("/stream", json=2, headers={"accept": NDJSON})
        alone = await client.post("/stream/Counter", json="c:1", headers={"accept": NDJSON})
        none = await client.post("/stream/Name", json=1)
    assert [json.loads(line) for line in whole.text.splitlines()] == [
        {"chunk": "item2-0"},
        {"chunk": "item2-1"},
        {"end": {"status": "complete", "chunks": 2}},
    ]
    assert json.loads(alone.text.splitlines()[0]) == {"chunk": "c-0"}
    assert none.status_code == 404


def _length(item: str) -> float:
    return float(item.split(":")[1])


async def test_an_item_over_the_cost_budget_is_422_before_the_stream_starts(serve: Serve) -> None:
    stage = Stage(Counter, mode="thread", max_batch_size=4, cost_fn=_length, max_batch_cost=6)
    async with serve(HttpApp(Service(stage))) as client:
        refused = await client.post("/stream", json="big:7")
        fits = await client.post("/stream", json="ok:2", headers={"accept": "application/x-ndjson"})
    assert refused.status_code == 422
    assert refused.json()["error"] == "ItemTooLarge"
    assert "max_batch_cost=6" in refused.json()["message"]
    assert fits.status_code == 200 and "ok-1" in fits.text
