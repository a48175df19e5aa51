"""The OpenAI completion routes on ``microbatch serve``'s own connection layer: a
streamed answer is opened and written there, without ASGI; every other request goes
to the ASGI route, its body handed on. Either way a client gets what the ASGI app
alone answers (the same request to both, side by side, in this process), and the
official client reads it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest

import microbatch
from microbatch.errors import Overloaded
from microbatch.http import CompletionModel, HttpApp, HttpConfig
from tests.http.conftest import serving as serving_in_process
from tests.http.conftest import serving_natively
from tests.serve.connection_harness import Point, StreamingDoubler

from .conftest import serving
from .models import Speller

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def _speller() -> microbatch.Service[object, object]:
    service: microbatch.Service[object, object] = microbatch.Service(
        microbatch.Stage(Speller, mode="thread", max_batch_size=4), name="spell"
    )
    service.completion_model = CompletionModel(count_tokens=len)  # type: ignore[attr-defined]
    return service


class _Recorded:
    """The requests an app's connection layer answered itself (it records them through
    ``app.record``; the ASGI app counts its own in its metrics instead)."""

    def __init__(self, app: HttpApp) -> None:
        self.native: list[tuple[str, int]] = []
        recording = app.record

        def record(route: str, status: int, seconds: float, request_id: str, client: str) -> None:
            self.native.append((route, status))
            recording(route, status, seconds, request_id, client)

        app.record = record  # type: ignore[method-assign]


@asynccontextmanager
async def both(
    config: HttpConfig | None = None,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, _Recorded]]:
    """A client of the ASGI app alone, and one of the connection layer (a second app
    over a service of its own), and what the connection layer answered itself."""
    asgi_app, native_app = HttpApp(_speller(), config), HttpApp(_speller(), config)
    recorded = _Recorded(native_app)
    async with serving_in_process(asgi_app) as asgi, serving_natively(native_app) as native:
        yield asgi, native, recorded


async def _answer(client: httpx.AsyncClient, path: str, body: Any, **headers: str) -> Any:
    """Status, content type and body of the answer to ``body`` (its events), with what
    differs between two answers taken out: their ids and the time they were made."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"content-type": "application/json", **headers}
    async with client.stream("POST", path, content=content, headers=sent) as response:
        raw = await response.aread()
    kind = response.headers["content-type"]
    if kind.startswith("text/event-stream"):
        events: list[Any] = []
        for line in raw.decode().split("\n\n"):
            if not line:
                continue
            assert line.startswith("data: ")
            data = line.removeprefix("data: ")
            event = data if data == "[DONE]" else json.loads(data)
            if isinstance(event, dict):
                event.pop("id", None)
                event.pop("created", None)
            events.append(event)
        return response.status_code, kind, events
    decoded = json.loads(raw)
    for own in ("id", "created", "request_id"):  # the answer's, the request's
        decoded.pop(own, None)
    return response.status_code, kind, decoded


STREAMED = [
    (CHAT, {"messages": HI, "max_tokens": 5, "stream": True}),
    (CHAT, {"messages": HI, "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "xyz", "max_tokens": 7, "stream": True}),
    ("/v1/completions", {"prompt": ["ab", "cd"], "max_tokens": 3, "stream": True}),  # two
    ("/v1/completions", {"prompt": "abc", "n": 2, "max_tokens": 4, "stream": True}),
    ("/v1/completions", {"prompt": "abcabc", "stop": "ca", "stream": True}),  # a stop
    ("/v1/completions", {"prompt": "x!", "max_tokens": 5, "stream": True}),  # fails mid-way
]


@pytest.mark.parametrize(("path", "body"), STREAMED)
async def test_a_streamed_answer_is_written_natively_as_asgi_writes_it(
    path: str, body: dict[str, Any]
) -> None:
    async with both() as (asgi, native, recorded):
        asked = {"model": "spell", **body}
        expected = await _answer(asgi, path, asked)
        assert await _answer(native, path, asked) == expected
        last = expected[2][-1]
        assert expected[0] == 200 and (last == "[DONE]" or "spelled a '!'" in json.dumps(last))
        assert recorded.native == [(path, 200)]  # opened and written without ASGI


ASGI_ANSWERS = [
    (CHAT, {"model": "spell", "messages": HI, "max_tokens": 3}),  # no stream: one answer
    ("/v1/completions", {"model": "spell", "prompt": "ab", "max_tokens": 3, "stream": False}),
    (CHAT, {"model": "nobody", "messages": HI, "stream": True}),  # 404, naming the model
    ("/v1/completions", {"model": "spell", "prompt": "a", "max_tokens": -1, "stream": True}),
    ("/v1/completions", {"model": "spell", "prompt": "a", "echo": True, "stream": True}),
    (CHAT, b'{"model": "spell", "messages": [{"role": "user"'),  # malformed
    (CHAT, b"[1, 2]"),
]


@pytest.mark.parametrize(("path", "body"), ASGI_ANSWERS)
async def test_what_does_not_stream_goes_to_the_asgi_route_with_its_body(
    path: str, body: Any
) -> None:
    async with both() as (asgi, native, recorded):
        expected = await _answer(asgi, path, body)
        assert await _answer(native, path, body) == expected
        assert recorded.native == []  # the ASGI route answered it
    if expected[0] != 200:
        assert set(expected[2]["error"]) == {"message", "type", "param", "code"}


async def test_a_refused_header_goes_to_the_asgi_route_which_answers_it() -> None:
    async with both(HttpConfig(auth_token="sesame")) as (asgi, native, recorded):
        asked = {"model": "spell", "messages": HI, "stream": True}
        for headers in (
            {},  # no token: 401
            {"authorization": "Bearer sesame", "x-request-timeout-ms": "soon"},  # 400
        ):
            expected = await _answer(asgi, CHAT, asked, **headers)
            assert expected[0] in (400, 401)
            assert await _answer(native, CHAT, asked, **headers) == expected
        assert recorded.native == []
        good = await _answer(native, CHAT, asked, authorization="Bearer sesame")
        assert good[0] == 200 and recorded.native == [(CHAT, 200)]


async def test_a_deadline_before_the_first_chunk_is_504_openais_way_natively() -> None:
    async with both() as (asgi, native, recorded):
        asked = {"model": "spell", "prompt": "~~", "max_tokens": 2, "stream": True}
        expected = await _answer(asgi, "/v1/completions", asked, **{"x-request-timeout-ms": "50"})
        assert expected[0] == 504 and expected[2]["error"]["type"] == "server_error"
        got = await _answer(native, "/v1/completions", asked, **{"x-request-timeout-ms": "50"})
        assert got == expected
        assert recorded.native == [("/v1/completions", 504)]


class _Refusing(StreamingDoubler):
    """A text generator whose streams are all refused: the queue is full."""

    name = "full"

    def __init__(self) -> None:
        super().__init__()
        self.completion_model = CompletionModel(item=lambda asked: Point(len(asked.prompt)))

    def stream(self, item: Point, **_: Any) -> AsyncIterator[Any]:
        raise Overloaded("no room for another stream")


async def test_a_stream_the_servable_refuses_is_503_openais_way_natively() -> None:
    asgi_app, native_app = HttpApp(_Refusing()), HttpApp(_Refusing())
    recorded = _Recorded(native_app)
    asked = {"model": "full", "prompt": "a", "stream": True}
    async with serving_in_process(asgi_app) as asgi, serving_natively(native_app) as native:
        expected = await _answer(asgi, "/v1/completions", asked)
        assert expected[0] == 503 and "no room" in expected[2]["error"]["message"]
        assert await _answer(native, "/v1/completions", asked) == expected
    assert recorded.native == [("/v1/completions", 503)]


def test_the_official_client_streams_from_a_served_service() -> None:
    # one service: its routes are the connection layer's (several go through ASGI)
    with serving("tests.protocols.models:spell", options=("--log-level", "warning")) as running:
        url = f"{running.url}/v1"
        with openai.OpenAI(base_url=url, api_key="-", max_retries=0) as client:
            stream = client.chat.completions.create(
                model="spell",
                messages=HI,
                max_tokens=6,
                stream=True,  # type: ignore[arg-type]
            )
            pieces = [chunk.choices[0].delta.content or "" for chunk in stream]
            assert "".join(pieces) == "user: "
            whole = client.completions.create(model="spell", prompt="ab", max_tokens=3)
            assert whole.choices[0].text == "aba"
            with pytest.raises(openai.NotFoundError):
                client.completions.create(model="nobody", prompt="ab", stream=True)


@pytest.mark.parametrize("stop", [None, "never"], ids=["straight", "read-by-a-task"])
async def test_a_client_that_leaves_mid_stream_frees_its_slot_natively(stop: str | None) -> None:
    service: microbatch.Service[object, object] = microbatch.Service(
        microbatch.Stage(Speller, mode="thread", max_batch_size=1), name="spell"
    )
    service.completion_model = CompletionModel()  # type: ignore[attr-defined]
    app = HttpApp(service)
    recorded = _Recorded(app)
    endless = {"model": "spell", "prompt": "~", "max_tokens": 100_000, "stream": True}
    if stop is not None:
        endless["stop"] = stop
    async with serving_natively(app) as client:
        async with client.stream("POST", "/v1/completions", json=endless) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break  # one event, then the client leaves
        # one item at a time: this one runs only once the first left its slot
        short = {"model": "spell", "prompt": "ab", "max_tokens": 2}
        reply = await asyncio.wait_for(client.post("/v1/completions", json=short), 10)
        assert reply.json()["choices"][0]["text"] == "ab"
    assert recorded.native[0] == ("/v1/completions", 499)  # the client closed it
