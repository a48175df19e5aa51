"""Item types declared as pydantic models: validation, both codecs, the schema."""

from __future__ import annotations

import asyncio

import msgspec
from openapi_spec_validator import validate

from microbatch.http import app

from . import pydantic_models
from .conftest import serving

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


async def test_pydantic_items_in_and_results_out_each_its_own() -> None:
    async with serving(app(pydantic_models.scale)) as client:
        replies = await asyncio.gather(
            *(client.post("/predict", json={"x": i, "y": -i, "weight": 2}) for i in range(40))
        )
        packed = await client.post(
            "/predict", content=msgspec.msgpack.encode({"x": 1.5, "y": 2}), headers=MSGPACK
        )
    assert [r.json() for r in replies] == [{"x": 2.0 * i, "y": -2.0 * i} for i in range(40)]
    assert msgspec.msgpack.decode(packed.content) == {"x": 1.5, "y": 2.0}


async def test_pydantic_validation_is_a_422_naming_the_field_and_bad_json_a_400() -> None:
    async with serving(app(pydantic_models.scale)) as client:
        negative = await client.post("/predict", json={"x": 1, "y": 2, "weight": -1})
        missing = await client.post("/predict", json={"x": 1})
        good = await client.post("/predict", json={"x": 1, "y": 2})
        broken = await client.post(
            "/predict", content=b'{"x": 1,', headers={"content-type": "application/json"}
        )
        bad_msgpack = await client.post(
            "/predict", content=msgspec.msgpack.encode({"x": "a", "y": 1}), headers=MSGPACK
        )
    assert (negative.status_code, missing.status_code, good.status_code) == (422, 422, 200)
    assert "weight" in negative.json()["message"]
    assert "`y`" in missing.json()["message"]
    assert broken.status_code == 400
    assert bad_msgpack.status_code == 422
    assert "`x`" in msgspec.msgpack.decode(bad_msgpack.content)["message"]


def test_the_openapi_document_carries_the_pydantic_schemas() -> None:
    document = app(pydantic_models.scale).openapi
    validate(document)
    schemas = document["components"]["schemas"]
    body = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["properties"]["weight"]["minimum"] == 0
    assert "ErrorBody" in schemas
