"""The ASGI app in-process: every status code, both codecs, numpy, disconnects."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import msgspec
import pytest

import microbatch
from microbatch.http import app

from ..conftest import settle
from . import models
from .conftest import Recorder, http_scope, serving

JSON = {"content-type": "application/json"}
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


async def test_predict_answers_each_concurrent_caller_with_its_own_result() -> None:
    async with serving(app(models.double)) as client:
        replies = await asyncio.gather(
            *(client.post("/predict", json={"x": x + 0.5}) for x in range(100))
        )
    assert [r.status_code for r in replies] == [200] * 100
    assert [r.json() for r in replies] == [{"y": 2 * x + 1.0} for x in range(100)]
    assert all(r.headers["content-type"] == "application/json" for r in replies)


async def test_msgpack_both_ways_and_mixed_with_json() -> None:
    async with serving(app(models.double)) as client:
        packed = await client.post(
            "/predict", content=msgspec.msgpack.encode({"x": 1.5}), headers=MSGPACK
        )
        json_in = await client.post(
            "/predict", json={"x": 2}, headers={"accept": "application/msgpack"}
        )
        msgpack_in = await client.post(
            "/predict",
            content=msgspec.msgpack.encode({"x": 3}),
            headers={"content-type": "application/x-msgpack"},
        )
    assert packed.headers["content-type"] == "application/msgpack"
    assert msgspec.msgpack.decode(packed.content) == {"y": 3.0}
    assert msgspec.msgpack.decode(json_in.content) == {"y": 4.0}
    assert msgpack_in.json() == {"y": 6.0}


async def test_422_names_the_path_and_fails_only_that_request() -> None:
    async with serving(app(models.double)) as client:
        bodies: list[Any] = [{"x": 1}, {"x": "one"}, {"x": 3}, {}, {"x": 5}]
        replies = await asyncio.gather(*(client.post("/predict", json=b) for b in bodies))
    assert [r.status_code for r in replies] == [200, 422, 200, 422, 200]
    assert replies[1].json()["error"] == "ValidationError"
    assert "$.x" in replies[1].json()["message"]
    assert "x" in replies[3].json()["message"]
    assert [replies[i].json() for i in (0, 2, 4)] == [{"y": 2.0}, {"y": 6.0}, {"y": 10.0}]


@pytest.mark.parametrize(
    ("body", "headers"),
    [(b'{"x": ', JSON), (b"\xc1", {"content-type": "application/msgpack"}), (b"", JSON)],
)
async def test_400_for_a_malformed_body(body: bytes, headers: dict[str, str]) -> None:
    async with serving(app(models.double)) as client:
        reply = await client.post("/predict", content=body, headers=headers)
    assert reply.status_code == 400
    assert reply.json()["error"] == "MalformedBody"


@pytest.mark.parametrize(
    ("body", "content_type", "says"),
    [
        (b'{"x": "\xff"}', "application/json", "UTF-8"),
        (b"\x81\xa1x\xa1\xff", "application/msgpack", "UTF-8"),
        (b"[" * 10_000 + b"]" * 10_000, "application/json", "nested"),
        (b"\x91" * 10_000 + b"\xc0", "application/msgpack", "nested"),
    ],
)
async def test_400_for_a_body_nested_too_deeply_or_not_utf_8(
    body: bytes, content_type: str, says: str
) -> None:
    async with serving(app(models.untyped)) as client:
        reply = await client.post("/predict", content=body, headers={"content-type": content_type})
        fine = await client.post("/predict", content=b"[[[1]]]", headers=JSON)
    assert reply.status_code == 400
    assert reply.json()["error"] == "MalformedBody" and says in reply.json()["message"]
    assert fine.json() == {"echo": [[[1]]]}


async def test_415_and_406_for_formats_other_than_json_and_msgpack() -> None:
    async with serving(app(models.double)) as client:
        pickled = await client.post(
            "/predict", content=b"\x80\x04N.", headers={"content-type": "application/python-pickle"}
        )
        html_only = await client.post("/predict", json={"x": 1}, headers={"accept": "text/html"})
        anything = await client.post("/predict", json={"x": 1}, headers={"accept": "*/*"})
    assert pickled.status_code == 415
    assert html_only.status_code == 406
    assert anything.json() == {"y": 2.0}


async def test_413_when_content_length_is_over_the_limit() -> None:
    async with serving(app(models.double, max_body_bytes=100)) as client:
        big = await client.post("/predict", content=b'{"x": 1' + b" " * 200 + b"}", headers=JSON)
        fits = await client.post("/predict", content=b'{"x": 1' + b" " * 50 + b"}", headers=JSON)
    assert big.status_code == 413
    assert big.json()["error"] == "BodyTooLarge"
    assert fits.status_code == 200


async def test_413_for_a_streamed_body_stops_reading_at_the_limit() -> None:
    served = app(models.double, max_body_bytes=1000)
    chunks_read = 0

    async def endless_body() -> dict[str, Any]:
        nonlocal chunks_read
        chunks_read += 1
        return {"type": "http.request", "body": b" " * 100, "more_body": True}

    sent = Recorder()
    await served(http_scope(), endless_body, sent)
    assert sent.status == 413
    assert chunks_read <= 12  # 1000 bytes in chunks of 100, and not much more


async def test_408_when_the_body_does_not_arrive_in_time() -> None:
    served = app(models.double, body_timeout_s=0.05)
    never = asyncio.Event()

    async def stalled_body() -> dict[str, Any]:
        await never.wait()
        raise AssertionError("unreachable")

    sent = Recorder()
    await served(http_scope(), stalled_body, sent)
    assert sent.status == 408


async def test_504_when_the_deadline_passes_and_the_client_may_only_lower_it() -> None:
    async with serving(app(models.double, default_timeout_s=30)) as client:
        lowered = await client.post(
            "/predict", json={"x": 7}, headers={"x-request-timeout-ms": "50"}
        )
        bad_header = await client.post(
            "/predict", json={"x": 1}, headers={"x-request-timeout-ms": "soon"}
        )
        ok = await client.post("/predict", json={"x": 1}, headers={"x-request-timeout-ms": "1e9"})
    assert lowered.status_code == 504
    assert lowered.json()["error"] == "DeadlineExceeded"
    assert bad_header.status_code == 400
    assert ok.json() == {"y": 2.0}
    async with serving(app(models.double, default_timeout_s=0.05)) as client:
        by_default = await client.post("/predict", json={"x": 7})
    assert by_default.status_code == 504


async def test_500_is_short_and_carries_no_traceback_and_neighbours_succeed() -> None:
    async with serving(app(models.double)) as client:
        replies = await asyncio.gather(
            *(client.post("/predict", json={"x": x}) for x in (12, 13, 14))
        )
    assert [r.status_code for r in replies] == [200, 500, 200]
    body = replies[1].json()
    assert body["error"] == "ModelError"
    assert "ValueError" in body["message"]
    assert "secret" not in replies[1].text
    assert "Traceback" not in replies[1].text
    assert body["request_id"] == replies[1].headers["x-request-id"]


async def test_500_when_the_result_cannot_be_encoded() -> None:
    async with serving(app(models.unencodable)) as client:
        reply = await client.post("/predict", json=1)
    assert reply.status_code == 500
    assert reply.json()["error"] == "UnencodableResult"


async def test_503_with_retry_after_when_overloaded_and_when_draining() -> None:
    models.GATE = asyncio.Event()
    served = app(models.gated)
    async with serving(served) as client:
        running = asyncio.ensure_future(client.post("/predict", json=1))
        await settle()
        assert models.gated.batcher.stats().in_flight == 1
        queued = asyncio.ensure_future(client.post("/predict", json=2))
        await settle()
        assert models.gated.batcher.stats().queued == 1
        refused = await client.post("/predict", json=3)
        models.GATE.set()
        assert [(await running).json(), (await queued).json()] == [2, 3]
        served.begin_draining()
        draining = await client.post("/predict", json=4)
        ready = await client.get("/health/ready")
    assert refused.status_code == 503
    assert refused.json()["error"] == "Overloaded"
    assert refused.headers["retry-after"] == "1"
    assert draining.status_code == 503
    assert draining.headers["retry-after"] == "1"
    assert ready.status_code == 503


async def test_a_client_that_disconnects_cancels_its_queued_item() -> None:
    models.GATE = asyncio.Event()
    models.SEEN.clear()
    served = app(models.gated)
    async with serving(served) as client:
        running = asyncio.ensure_future(client.post("/predict", json=1))
        await settle()
        assert models.gated.batcher.stats().in_flight == 1
        gone = asyncio.Event()
        messages = [{"type": "http.request", "body": b"2", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        sent = Recorder()
        leaving = asyncio.ensure_future(served(http_scope(), receive, sent))
        await settle()
        assert models.gated.batcher.stats().queued == 1
        gone.set()
        await leaving
        models.GATE.set()
        assert (await running).json() == 2
        metrics = (await client.get("/metrics")).text
        assert models.gated.batcher.stats().cancelled == 1
    assert sent.messages == []
    assert models.SEEN == [1]
    assert 'microbatch_http_requests_total{route="/predict",status="499"} 1.0' in metrics


async def test_health_probes_follow_the_lifespan() -> None:
    served = app(models.double)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=served), base_url="http://test"
    ) as client:
        assert (await client.get("/health/live")).status_code == 200
        assert (await client.get("/health/ready")).status_code == 503
        async with serving(served) as inside:
            assert (await inside.get("/health/ready")).json() == {"status": "ready"}
        after = await client.get("/health/ready")
    assert after.status_code == 503
    assert after.headers["retry-after"] == "1"


async def test_401_without_the_bearer_token_except_on_probes() -> None:
    async with serving(app(models.double, auth_token="s3cret")) as client:
        missing = await client.post("/predict", json={"x": 1})
        wrong = await client.post(
            "/predict", json={"x": 1}, headers={"authorization": "Bearer s3cre"}
        )
        right = await client.post(
            "/predict", json={"x": 1}, headers={"authorization": "Bearer s3cret"}
        )
        metrics = await client.get("/metrics")
        probes = [await client.get(p) for p in ("/health/live", "/health/ready")]
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert missing.headers["www-authenticate"] == "Bearer"
    assert metrics.status_code == 401
    assert [p.status_code for p in probes] == [200, 200]


async def test_404_and_405() -> None:
    async with serving(app(models.double)) as client:
        unknown = await client.get("/nowhere")
        wrong_method = await client.get("/predict")
    assert unknown.status_code == 404
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"


async def test_numpy_arrays_in_both_codecs_and_bad_arrays_get_422() -> None:
    async with serving(app(models.scale)) as client:
        as_json = await client.post("/predict", json=[[1, 2], [3, 4]])
        as_msgpack = await client.post(
            "/predict", content=msgspec.msgpack.encode([0.5, 1.5]), headers=MSGPACK
        )
        ragged = await client.post("/predict", json=[[1, 2], [3]])
        words = await client.post("/predict", json=["a", "b"])
    assert as_json.json() == [[2.0, 4.0], [6.0, 8.0]]
    assert msgspec.msgpack.decode(as_msgpack.content) == [1.0, 3.0]
    assert ragged.status_code == 422
    assert words.status_code == 422


async def test_an_untyped_function_takes_any_json() -> None:
    async with serving(app(models.untyped)) as client:
        reply = await client.post("/predict", json={"anything": [1, None, "x"]})
    assert reply.json() == {"echo": {"anything": [1, None, "x"]}}


async def test_a_service_in_worker_processes_over_http() -> None:
    service = microbatch.Service(
        microbatch.Stage(models.Double, batching=microbatch.BatchConfig(max_batch_size=8)),
        examples=[models.Point(1.0)],
    )
    async with serving(app(service)) as client:
        assert (await client.get("/health/ready")).status_code == 200
        replies = await asyncio.gather(
            *(client.post("/predict", json={"x": x}) for x in (1, 13, 3))
        )
        metrics = (await client.get("/metrics")).text
    assert [r.status_code for r in replies] == [200, 500, 200]
    assert replies[0].json() == {"y": 2.0}
    assert replies[1].json()["message"] == "the model raised ValueError"
    assert "secret" not in replies[1].text
    assert 'microbatch_workers_alive{stage="Double"} 1.0' in metrics
    assert not service.ready
