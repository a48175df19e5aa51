"""Issue 6, item 9: fuzzing.

* The codecs: any bytes, and mutations of valid bodies, into the decoders of every
  kind of item type; any Content-Type and Accept value. Only msgspec's DecodeError
  and ValidationError (400, 422) or our UnsupportedMediaType/NotAcceptable (415,
  406) may come out: never a crash, never a 500.
* The ASGI app in-process: random methods, paths, headers and bodies against a model
  that never fails: only documented statuses, never a 5xx, always an error body.

schemathesis against a real server's /openapi.json (positive and negative cases)
is tests/http/test_schema_fuzz.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch.http import app
from microbatch.http.codecs import (
    CODECS,
    NotAcceptable,
    UnsupportedMediaType,
    codec_for_accept,
    codec_for_content_type,
)
from microbatch.http.status import error_reply
from tests.http import models
from tests.http.conftest import Recorder, http_scope

from .harness import report

ITEM_TYPES: list[Any] = [
    Any,
    models.Point,
    int,
    list[float],
    dict[str, int],
    tuple[int, str],
    npt.NDArray[np.float32],
]
EXAMPLES = 1500
DECODERS = [(codec.name, t, codec.make_decoder(t)) for codec in CODECS for t in ITEM_TYPES]
EXPECTED = (msgspec.DecodeError, msgspec.ValidationError)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Random bytes, or a valid JSON/msgpack body with a few bytes flipped or cut."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    value = draw(json_values)
    encode = draw(st.sampled_from([msgspec.json.encode, msgspec.msgpack.encode]))
    body = bytearray(encode(value))
    for _ in range(draw(st.integers(0, 3))):
        if body:
            body[draw(st.integers(0, len(body) - 1))] = draw(st.integers(0, 255))
    return bytes(body[: draw(st.integers(0, len(body)))])


def test_the_codecs_raise_only_decode_and_validation_errors() -> None:
    outcomes: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None)
    @given(body=bodies(), media=st.binary(max_size=40), accept=st.binary(max_size=40))
    def one(body: bytes, media: bytes, accept: bytes) -> None:
        for _, _, decode in DECODERS:
            try:
                decode(body)
                outcomes["decoded"] += 1
            except EXPECTED as error:
                assert 400 <= error_reply(error).status < 500
                outcomes[type(error).__name__] += 1
        for choose, refusal in (
            (codec_for_content_type, UnsupportedMediaType),
            (codec_for_accept, NotAcceptable),
        ):
            try:
                choose(media if choose is codec_for_content_type else accept)
            except refusal as error:
                assert error_reply(error).status in (406, 415)

    one()
    report("codec fuzz", decoders=len(DECODERS), examples=EXAMPLES, by_outcome=outcomes, crashes=0)
    assert outcomes["decoded"] and outcomes["DecodeError"] and outcomes["ValidationError"]


PATHS = ["/predict", "/health/live", "/health/ready", "/metrics", "/openapi.json", "/docs"]
ODD_PATHS = ["/", "/nope", "/predict/", "/PREDICT", "//predict", "/predict?x=1", "/%00"]
HEADER_NAMES = ["content-type", "accept", "x-request-timeout-ms", "content-length", "x-other"]
DOCUMENTED = {200, 400, 404, 405, 406, 408, 413, 415, 422, 503, 504}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, list[tuple[bytes, bytes]], bytes]:
    method = draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT"]))
    path = draw(st.sampled_from(["/predict"] * 12 + PATHS + ODD_PATHS))
    names = draw(st.lists(st.sampled_from(HEADER_NAMES), max_size=4))
    values = st.sampled_from(
        [b"application/json", b"application/msgpack", b"*/*", b"text/html", b"5", b"-1"]
    ) | st.binary(max_size=20)
    headers = [(name.encode(), draw(values)) for name in names]
    body = draw(bodies() | st.builds(lambda x: msgspec.json.encode({"x": x}), json_values))
    return method, path, headers, body


def test_the_app_answers_random_requests_with_documented_statuses_only() -> None:
    served = app(models.halve, default_timeout_s=5)
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=EXAMPLES // 2,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(request=requests())
    def one(request: tuple[str, str, list[tuple[bytes, bytes]], bytes]) -> None:
        method, path, headers, body = request
        sent = asyncio.run(call(served, method, path, headers, body))
        statuses[sent.status or 0] += 1
        assert sent.status in DOCUMENTED, (request, sent.messages)
        if sent.status >= 400:
            start = sent.messages[0]
            content_type = dict(start["headers"])[b"content-type"]
            decode = msgspec.msgpack.decode if b"msgpack" in content_type else msgspec.json.decode
            error = decode(sent.messages[-1]["body"])
            assert error["error"] and error["message"]

    one()
    report("app fuzz", requests=sum(statuses.values()), by_status=statuses, server_errors=0)
    assert statuses[200] and statuses[400] and statuses[422]


async def call(
    served: Any, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> Recorder:
    """One request through the ASGI app, the body in one message."""
    scope = http_scope(path, method, headers)
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            await never.wait()  # no disconnect while the item runs
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    sent = Recorder()
    await asyncio.wait_for(served(scope, receive, sent), 10)
    return sent
