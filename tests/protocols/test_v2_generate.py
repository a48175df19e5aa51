"""Triton's generate extension (``/v2/models/{name}/generate`` and
``.../generate_stream``) against a real ``microbatch serve`` of a step model, a
one-at-a-time step model and a model that does not stream (several services), and
in-process on one service's own app behind its token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import microbatch
from microbatch.http import HttpApp, HttpConfig
from tests.http.conftest import serving as serving_in_process

from .conftest import Running, serving
from .models import Speller


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with serving(
        "tests.protocols.models:spell",
        "tests.protocols.models:spell_one",
        "tests.protocols.models:double",
        options=("--log-level", "error"),
    ) as running:
        yield running


def _events(reply: httpx.Response) -> list[Any]:
    """The ``data:`` events of a Server-Sent Events answer, decoded."""
    assert reply.headers["content-type"] == "text/event-stream"
    return [
        json.loads(line.removeprefix("data: "))
        for line in reply.text.split("\n\n")
        if line.startswith("data: ")
    ]


def _left(server: Running) -> float:
    """How many streams of ``spell_one`` were left by their readers."""
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        named = 'outcome="left"' in line and 'service="spell_one"' in line
        if named and line.startswith("microbatch_streams_total{"):
            return float(line.split()[-1])
    return 0.0


def _spell_one_answers(server: Running) -> Any:
    """A short answer of the one-at-a-time model: it comes only once every stream
    before it has left its slot."""
    body = {"prompt": "ok", "max_tokens": 3}
    return httpx.post(f"{server.url}/v2/models/spell_one/generate", json=body).json()


def test_generate_joins_the_whole_stream_into_one_answer(server: Running) -> None:
    body = {"prompt": "Beautiful is", "max_tokens": 15, "parameters": {"stream": True}}
    reply = httpx.post(f"{server.url}/v2/models/spell/generate", json=body)
    assert reply.status_code == 200
    assert reply.json() == {
        "model_name": "spell",
        "model_version": "1",
        "output": "Beautiful isBea",
    }


def test_generate_stream_sends_each_chunk_as_an_event_in_order(server: Running) -> None:
    body = {"prompt": "Beautiful is", "max_tokens": 14}
    reply = httpx.post(f"{server.url}/v2/models/spell/generate_stream", json=body)
    assert reply.status_code == 200
    assert _events(reply) == [
        {"model_name": "spell", "model_version": "1", "output": character}
        for character in "Beautiful isBe"
    ]


def test_the_version_1_paths_answer_the_same(server: Running) -> None:
    base = f"{server.url}/v2/models/spell/versions/1"
    body = {"prompt": "ab", "max_tokens": 3}
    assert httpx.post(f"{base}/generate", json=body).json()["output"] == "aba"
    events = _events(httpx.post(f"{base}/generate_stream", json=body))
    assert [event["output"] for event in events] == ["a", "b", "a"]


def test_a_model_that_does_not_stream_answers_once_on_both_routes(server: Running) -> None:
    base = f"{server.url}/v2/models/double"
    answer = httpx.post(f"{base}/generate", json={"x": 2.5}).json()
    assert (answer["model_name"], answer["model_version"], answer["y"]) == ("double", "1", 5.0)
    assert set(answer) == {"model_name", "model_version", "y", "batch"}
    (event,) = _events(httpx.post(f"{base}/generate_stream", json={"x": 1.5}))
    assert (event["model_name"], event["y"]) == ("double", 3.0)


def test_the_server_metadata_lists_the_extension(server: Running) -> None:
    extensions = httpx.get(f"{server.url}/v2").json()["extensions"]
    assert extensions == ["binary_tensor_data", "generate"]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_an_unknown_model_is_404(server: Running, route: str) -> None:
    reply = httpx.post(f"{server.url}/v2/models/nobody/{route}", json={"prompt": "a"})
    assert reply.status_code == 404


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(
    ("model", "body", "named"),
    [
        ("spell", {"prompt": "ab", "z": 1}, "unknown input 'z'"),
        ("spell", {"max_tokens": 3}, "missing input 'prompt'"),
        ("spell", {"prompt": ""}, "$.prompt"),  # the item type's min_length
        ("spell", {"prompt": "ab", "max_tokens": 0}, "$.max_tokens"),
        ("double", {"x": "two"}, "input 'x'"),
        ("double", [1.0], "JSON object"),
    ],
)
def test_a_bad_or_missing_input_is_400_naming_it(
    server: Running, route: str, model: str, body: Any, named: str
) -> None:
    reply = httpx.post(f"{server.url}/v2/models/{model}/{route}", json=body)
    assert reply.status_code == 400
    assert named in reply.json()["error"]


def test_an_item_failing_mid_stream_ends_with_its_error_event(server: Running) -> None:
    body = {"prompt": "ab!", "max_tokens": 10}
    reply = httpx.post(f"{server.url}/v2/models/spell/generate_stream", json=body)
    assert reply.status_code == 200
    *chunks, last = _events(reply)
    assert [chunk["output"] for chunk in chunks] == ["a", "b"]
    assert last == {"error": "the prompt spelled a '!'"}
    joined = httpx.post(f"{server.url}/v2/models/spell/generate", json=body)
    assert (joined.status_code, joined.json()) == (422, {"error": "the prompt spelled a '!'"})


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_an_item_failing_before_its_first_chunk_is_its_status(server: Running, route: str) -> None:
    reply = httpx.post(f"{server.url}/v2/models/spell/{route}", json={"prompt": "!"})
    assert (reply.status_code, reply.json()) == (422, {"error": "the prompt spelled a '!'"})


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_a_deadline_that_passes_is_504(server: Running, route: str) -> None:
    reply = httpx.post(
        f"{server.url}/v2/models/spell/{route}",
        json={"prompt": "~"},  # its step takes 0.2 s
        headers={"X-Request-Timeout-Ms": "50"},
    )
    assert reply.status_code == 504
    assert "error" in reply.json()


def test_a_client_that_disconnects_mid_stream_frees_the_slot(server: Running) -> None:
    left = _left(server)
    body = {"prompt": "ab", "max_tokens": 1_000_000}  # minutes, unless the stream is left
    url = f"{server.url}/v2/models/spell_one/generate_stream"
    with httpx.stream("POST", url, json=body) as reply:
        first = next(reply.iter_lines())
        assert json.loads(first.removeprefix("data: "))["output"] == "a"  # now hang up
    assert _spell_one_answers(server)["output"] == "oko"  # one at a time: it left
    assert _left(server) == left + 1


def test_a_client_that_hangs_up_on_a_joined_answer_frees_the_slot(server: Running) -> None:
    left = _left(server)
    body = {"prompt": "ab", "max_tokens": 1_000_000}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up, closing its connection
        httpx.post(f"{server.url}/v2/models/spell_one/generate", json=body, timeout=0.3)
    assert _spell_one_answers(server)["output"] == "oko"
    assert _left(server) == left + 1


async def test_one_services_own_app_serves_both_routes_behind_its_token() -> None:
    speller = microbatch.Stage(Speller, mode="thread", max_batch_size=4)
    app = HttpApp(microbatch.Service(speller, name="spell"), HttpConfig(auth_token="sesame"))
    body = {"prompt": "hey", "max_tokens": 4}
    token = {"Authorization": "Bearer sesame"}
    async with serving_in_process(app) as client:
        refused = await client.post("/v2/models/spell/generate", json=body)
        assert refused.status_code == 401
        joined = await client.post("/v2/models/spell/generate", json=body, headers=token)
        assert joined.json()["output"] == "heyh"
        streamed = await client.post("/v2/models/spell/generate_stream", json=body, headers=token)
        assert [event["output"] for event in _events(streamed)] == list("heyh")
        metadata = await client.get("/v2", headers=token)
        assert "generate" in metadata.json()["extensions"]


class Tokens(microbatch.StepModel):
    """Spells each text back as records: a character and its position, a step each."""

    def start(self, items: list[str]) -> list[list[Any]]:
        return [[text, 0] for text in items]

    def step(self, states: list[list[Any]]) -> tuple[list[dict[str, Any]], list[bool]]:
        chunks = [{"token": text[made], "position": made} for text, made in states]
        for state in states:
            state[1] += 1
        return chunks, [made >= len(text) for text, made in states]


async def test_record_chunks_join_text_outputs_and_list_the_others() -> None:
    tokens = microbatch.Service(microbatch.Stage(Tokens, mode="thread"), name="tokens")
    async with serving_in_process(HttpApp(tokens, HttpConfig())) as client:
        joined = await client.post("/v2/models/tokens/generate", json={"input": "abc"})
        assert joined.json() == {
            "model_name": "tokens",
            "model_version": "1",
            "token": "abc",
            "position": [0, 1, 2],
        }
        streamed = await client.post("/v2/models/tokens/generate_stream", json={"input": "ab"})
        assert _events(streamed) == [
            {"model_name": "tokens", "model_version": "1", "token": "a", "position": 0},
            {"model_name": "tokens", "model_version": "1", "token": "b", "position": 1},
        ]
