"""Whatever a client sends to v2 ``infer``, the answer is 200 or 4xx with a reason:
never a 500 (in-process, through the ASGI app)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch.http import HttpApp
from microbatch.tensors import DATATYPES
from tests.http.conftest import serving

from .models import scale, shout

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=10,
)
INPUTS = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "input", "text", ""]),
        "datatype": st.sampled_from([*DATATYPES, "FP8", "int"]),
        "shape": st.lists(st.integers(-1, 4), max_size=3),
    },
    optional={"data": VALUES, "parameters": st.dictionaries(st.just("binary_data_size"), VALUES)},
)
BODIES = st.fixed_dictionaries(
    {"inputs": st.lists(INPUTS, max_size=3)},
    optional={
        "outputs": st.lists(st.fixed_dictionaries({"name": st.text(max_size=6)}), max_size=2),
        "parameters": st.dictionaries(st.sampled_from(["timeout", "binary_data_output"]), VALUES),
        "id": VALUES,
    },
)


def _post_all(bodies: list[tuple[str, Any, bytes]]) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        replies = []
        for served in (scale, shout):
            async with serving(HttpApp(served)) as client:
                for name, body, tail in bodies:
                    if name != served.name:
                        continue
                    json_part = msgspec.json.encode(body)
                    headers = {"Inference-Header-Content-Length": str(len(json_part))}
                    replies.append(
                        await client.post(
                            f"/v2/models/{name}/infer",
                            content=json_part + tail,
                            headers=headers if tail else {},
                        )
                    )
        return replies

    return asyncio.run(main())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(["scale", "shout"]), BODIES, st.binary(max_size=24)),
        min_size=5,
        max_size=12,
    )
)
def test_any_v2_body_is_answered_without_a_server_error(
    bodies: list[tuple[str, Any, bytes]],
) -> None:
    for reply in _post_all(bodies):
        assert reply.status_code in (200, 400, 422), reply.text
        if reply.status_code != 200:
            assert reply.json()["error"]
