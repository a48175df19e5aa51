"""``/predict/{stage}``: each stage of a Service alone, beside the whole pipeline."""

from __future__ import annotations

import asyncio

import pytest
from openapi_spec_validator import validate

from microbatch.http import app

from . import models
from .conftest import serving


async def test_predict_runs_every_stage_and_each_stage_route_runs_one() -> None:
    async with serving(app(models.make_two_stages())) as client:
        whole, first, second = await asyncio.gather(
            client.post("/predict", json={"x": 1.5}),
            client.post("/predict/Double", json={"x": 1.5}),
            client.post("/predict/Describe", json={"y": 4}),
        )
    assert whole.json() == {"text": "y=3"}
    assert first.json() == {"y": 3.0}
    assert second.json() == {"text": "y=4"}


async def test_a_stage_route_validates_against_that_stages_input_type() -> None:
    async with serving(app(models.make_two_stages())) as client:
        wrong = await client.post("/predict/Describe", json={"x": 1.5})
        right = await client.post("/predict/Double", json={"x": 1.5})
    assert wrong.status_code == 422
    assert "`y`" in wrong.json()["message"]
    assert right.status_code == 200


async def test_concurrent_callers_of_every_route_get_their_own_answers() -> None:
    xs = [x + 0.5 for x in range(60)]
    async with serving(app(models.make_two_stages())) as client:
        replies = await asyncio.gather(
            *(
                client.post(["/predict", "/predict/Double"][i % 2], json={"x": x})
                for i, x in enumerate(xs)
            )
        )
    expected = [{"text": f"y={2 * x:g}"} if i % 2 == 0 else {"y": 2 * x} for i, x in enumerate(xs)]
    assert [r.json() for r in replies] == expected


async def test_a_single_stage_service_or_function_has_no_stage_routes() -> None:
    for served in (models.service, models.double):
        async with serving(app(served)) as client:
            reply = await client.post("/predict/Double", json={"x": 1.5})
        assert reply.status_code == 404


@pytest.mark.parametrize("token", [None, "t"])
def test_each_stage_route_is_in_the_openapi_document(token: str | None) -> None:
    document = app(models.two_stages, auth_token=token).openapi
    validate(document)
    paths = document["paths"]
    assert {"/predict", "/predict/Double", "/predict/Describe"} <= set(paths)
    describe = paths["/predict/Describe"]["post"]
    request = describe["requestBody"]["content"]["application/json"]["schema"]
    response = describe["responses"]["200"]["content"]["application/json"]["schema"]
    assert request == {"$ref": "#/components/schemas/Doubled"}
    assert response == {"$ref": "#/components/schemas/Described"}
    assert paths["/predict"]["post"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ] == {"$ref": "#/components/schemas/Described"}
    assert describe["operationId"] == "predict_Describe"


async def test_stage_routes_are_counted_in_metrics_by_path() -> None:
    async with serving(app(models.make_two_stages())) as client:
        await client.post("/predict/Double", json={"x": 1})
        text = (await client.get("/metrics")).text
    assert 'microbatch_http_requests_total{route="/predict/Double",status="200"} 1.0' in text
