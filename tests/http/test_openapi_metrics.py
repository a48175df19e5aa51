"""The OpenAPI document is valid OpenAPI 3.1; /docs shows it; /metrics has what we claim."""

from __future__ import annotations

import asyncio

import pytest
from openapi_spec_validator import validate

from microbatch.http import app

from . import models
from .conftest import serving


@pytest.mark.parametrize(
    "served", [models.double, models.scale, models.untyped, models.unencodable, models.service]
)
@pytest.mark.parametrize("token", [None, "t"])
def test_the_openapi_document_is_valid(served: object, token: str | None) -> None:
    document = app(served, auth_token=token).openapi
    validate(document)  # raises on an invalid document
    name = document["info"]["title"]
    models_v2 = [f"/v2/models/{name}", f"/v2/models/{name}/versions/1"]
    v2 = {"/v2", "/v2/health/live", "/v2/health/ready"} | {
        f"{base}{tail}"
        for base in models_v2
        for tail in ("", "/ready", "/infer", "/generate", "/generate_stream")
    }
    own = {"/predict", "/health/live", "/health/ready", "/metrics"}
    assert set(document["paths"]) == own | v2
    assert ("securitySchemes" in document["components"]) is (token is not None)


def test_the_request_and_response_schemas_come_from_the_type_hints() -> None:
    document = app(models.service).openapi
    post = document["paths"]["/predict"]["post"]
    schemas = document["components"]["schemas"]
    request = post["requestBody"]["content"]["application/msgpack"]["schema"]
    response = post["responses"]["200"]["content"]["application/json"]["schema"]
    assert request == {"$ref": "#/components/schemas/Point"}
    assert response == {"$ref": "#/components/schemas/Doubled"}
    assert schemas["Point"]["properties"] == {"x": {"type": "number"}}
    assert schemas["Point"]["required"] == ["x"]
    assert {"422", "413", "503", "504", "500"} <= set(post["responses"])


async def test_openapi_and_docs_are_served() -> None:
    async with serving(app(models.double)) as client:
        document = await client.get("/openapi.json")
        docs = await client.get("/docs")
    assert document.json()["info"]["title"] == "double"
    assert docs.headers["content-type"].startswith("text/html")
    assert "POST /predict" in docs.text
    assert "Point" in docs.text
    assert "<script" not in docs.text


async def test_metrics_count_requests_batches_and_deadline_drops() -> None:
    async with serving(app(models.double)) as client:
        await asyncio.gather(*(client.post("/predict", json={"x": x}) for x in (1, 2, 3)))
        await client.post("/predict", json={"x": "bad"})
        await client.post("/predict", json={"x": 7}, headers={"x-request-timeout-ms": "20"})
        reply = await client.get("/metrics")
    text = reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    for line in (
        'microbatch_http_requests_total{route="/predict",status="200"} 3.0',
        'microbatch_http_requests_total{route="/predict",status="422"} 1.0',
        'microbatch_http_requests_total{route="/predict",status="504"} 1.0',
        'microbatch_http_request_duration_seconds_count{route="/predict"} 5.0',
        'microbatch_items_dropped_total{reason="deadline",stage="double"} 1.0',
        'microbatch_batch_size_bucket{le="+Inf",stage="double"}',
        'microbatch_queue_depth{stage="double"} 0.0',
        'microbatch_in_flight_items{stage="double"}',
        'microbatch_worker_restarts_total{stage="double"} 0.0',
        'microbatch_queue_wait_seconds_bucket{le="0.0001",stage="double"}',
        'microbatch_queue_wait_seconds_bucket{le="+Inf",stage="double"}',
        'microbatch_queue_wait_seconds_sum{stage="double"}',
        "microbatch_ready 1.0",
    ):
        assert line in text, line


def test_each_app_has_its_own_registry() -> None:
    first, second = app(models.double), app(models.double)
    first.metrics.record("/predict", 200, 0.001)
    assert b'status="200"' in first.metrics.render()
    assert b'status="200"' not in second.metrics.render()
