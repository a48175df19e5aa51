"""Numbers a declared numpy dtype cannot hold are the client's error (422), named
where they are, in both codecs: never the model's (500)."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt
import pytest

import microbatch
from microbatch.http import app

from .conftest import serving

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


@dataclass
class Image:
    pixels: npt.NDArray[np.uint8]


@microbatch.batch(max_batch_size=8)
async def brightest(images: list[Image]) -> list[int]:
    return [int(image.pixels.max()) for image in images]


@microbatch.batch(max_batch_size=8)
async def total(rows: list[npt.NDArray[np.float32]]) -> list[float]:
    return [float(row.sum()) for row in rows]


HUGE = int("9" * 400)


@pytest.mark.parametrize(
    ("model", "body", "where", "dtype"),
    [
        (brightest, {"pixels": [1, 300]}, "$.pixels", "uint8"),
        (brightest, {"pixels": [[0], [-1]]}, "$.pixels", "uint8"),
        (total, [1.0, HUGE], None, "float32"),
        (total, [1e300], None, "float32"),
    ],
)
async def test_a_number_out_of_range_for_the_dtype_is_a_422_naming_where(
    model: object, body: object, where: str | None, dtype: str
) -> None:
    async with serving(app(model)) as client:
        as_json = await client.post("/predict", content=msgspec.json.encode(body))
        as_msgpack = (
            None
            if body == [1.0, HUGE]  # msgpack has no integers past 64 bits
            else await client.post(
                "/predict", content=msgspec.msgpack.encode(body), headers=MSGPACK
            )
        )
    assert as_json.status_code == 422, as_json.text
    message = as_json.json()["message"]
    assert f"out of range for {dtype}" in message
    if dtype == "uint8":
        assert "300" in message or "-1" in message  # the value, named
    if where is not None:  # a field's path; the body as a whole has none
        assert f"at `{where}`" in message
    assert len(message) < 400  # the 400-digit number is not echoed whole
    if as_msgpack is not None:
        assert as_msgpack.status_code == 422
        assert f"out of range for {dtype}" in msgspec.msgpack.decode(as_msgpack.content)["message"]


async def test_numbers_in_range_still_pass() -> None:
    async with serving(app(brightest)) as client:
        reply = await client.post("/predict", json={"pixels": [0, 255, 7]})
    assert reply.status_code == 200
    assert reply.json() == 255
