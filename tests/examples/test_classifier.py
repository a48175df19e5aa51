"""The iris example: starts, classifies, fails a bad request alone, shuts down."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from examples.classifier import IrisPrediction, IrisRequest, make_service
from microbatch.errors import RemoteError
from microbatch.http import app
from tests.http.conftest import serving

pytestmark = pytest.mark.timeout(120)


async def test_classifies_known_flowers_and_stops_its_workers() -> None:
    flowers = {
        IrisRequest(5.1, 3.5, 1.4, 0.2): "setosa",
        IrisRequest(5.7, 2.8, 4.1, 1.3): "versicolor",
        IrisRequest(6.5, 3.0, 5.8, 2.2): "virginica",
    }
    async with make_service() as service:
        assert service.ready
        pids = service.pools[0].pids
        answers = await asyncio.gather(
            *(service.submit(request, timeout_s=30) for request in list(flowers) * 20)
        )
    assert [a.species for a in answers] == list(flowers.values()) * 20
    assert all(isinstance(a, IrisPrediction) and 0.5 < a.probability <= 1.0 for a in answers)
    assert not service.ready and pids


async def test_a_non_finite_measurement_fails_alone() -> None:
    good = IrisRequest(5.1, 3.5, 1.4, 0.2)
    async with make_service() as service:
        outcomes = await asyncio.gather(
            service.submit(good),
            service.submit(IrisRequest(float("nan"), 3.0, 1.0, 0.1)),
            service.submit(good),
            return_exceptions=True,
        )
    assert isinstance(outcomes[1], RemoteError) and outcomes[1].type_name == "ValueError"
    assert "finite" in str(outcomes[1])
    assert [o.species for o in (outcomes[0], outcomes[2])] == ["setosa", "setosa"]  # type: ignore[union-attr]


async def test_serves_over_http_with_the_prediction_type_in_its_schema() -> None:
    async with serving(app(make_service())) as client:
        answer = await client.post(
            "/predict",
            json={"sepal_length": 6.5, "sepal_width": 3.0, "petal_length": 5.8, "petal_width": 2.2},
        )
        assert answer.status_code == 200
        assert answer.json()["species"] == "virginica"
        nan = msgspec.msgpack.encode(IrisRequest(float("nan"), 3.0, 1.0, 0.1))
        bad = await client.post(
            "/predict", content=nan, headers={"content-type": "application/msgpack"}
        )
        assert bad.status_code == 500 and "finite" not in bad.text  # no model detail leaks
        openapi = (await client.get("/openapi.json")).json()
    response = openapi["paths"]["/predict"]["post"]["responses"]["200"]
    assert response["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/IrisPrediction"
    }
