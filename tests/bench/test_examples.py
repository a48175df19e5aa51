"""``microbatch bench`` sends what the service declares: its warm-up ``examples``,
published by the app in OpenAPI, not a body made up from the schema."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

import microbatch
from microbatch.bench.bodies import examples_in
from microbatch.http import app

from ..http.conftest import serving
from .service import Point, service


async def openapi_examples(served: Any) -> list[Any]:
    async with serving(app(served)) as client:
        document = (await client.get("/openapi.json")).json()
    return examples_in(document, "/predict")


async def test_a_services_examples_are_in_its_openapi_document() -> None:
    assert service.examples == [Point(1.0)]
    assert await openapi_examples(service) == [{"x": 1.0}]


@microbatch.batch(max_batch_size=4)
async def total(rows: list[npt.NDArray[np.float32]]) -> list[float]:
    return [float(row.sum()) for row in rows]


@microbatch.batch(max_batch_size=4, examples=[np.array([1.0, 2.5], dtype=np.float32)])
async def total_with_examples(rows: list[npt.NDArray[np.float32]]) -> list[float]:
    return [float(row.sum()) for row in rows]


async def test_a_batched_functions_examples_are_published_too_arrays_as_lists() -> None:
    assert await openapi_examples(total) == []  # none declared: bench makes one up
    found = await openapi_examples(total_with_examples)
    assert found == [[1.0, 2.5]]
    assert msgspec.json.encode(found[0]) == b"[1.0,2.5]"
