"""OpenAI-compatible text generation (``/v1/completions``, ``/v1/chat/completions``),
spoken by the official ``openai`` client against a real ``microbatch serve`` of two
step models (several services), and in-process as a plain ASGI app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import openai
import pytest

import microbatch
from microbatch.http import CompletionModel, HttpApp, HttpConfig
from tests.http.conftest import serving as serving_in_process

from .conftest import Running, serving
from .models import Speller

TEMPLATE = "user: hi\nassistant:"  # the default chat template's prompt for one "hi"


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with serving(
        "tests.protocols.models:spell",
        "tests.protocols.models:spell_one",
        "tests.protocols.models:spell_on",
        options=("--log-level", "warning"),
    ) as running:
        yield running


@pytest.fixture
def client(server: Running) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def _async_client(server: Running) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _left(server: Running, service: str = "spell_one") -> float:
    """How many streams of ``service`` were left by their readers."""
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        named = 'outcome="left"' in line and f'service="{service}"' in line
        if named and line.startswith("microbatch_streams_total{"):
            return float(line.split()[-1])
    return 0.0


def _spell_one_answers(client: openai.OpenAI) -> str:
    """A short completion of the one-at-a-time model: it comes only once the stream
    before it has left its slot."""
    reply = client.completions.create(model="spell-one", prompt="ok", max_tokens=3)
    return reply.choices[0].text


def test_a_completion_spells_its_prompt_back(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="spell", prompt="abc", max_tokens=7)
    assert reply.object == "text_completion"
    assert reply.id.startswith("cmpl-")
    assert reply.model == "spell"
    assert [(c.index, c.text, c.finish_reason) for c in reply.choices] == [(0, "abcabca", "length")]
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 7)
    assert reply.usage.total_tokens == 10


def test_a_chat_completion_answers_from_the_templated_prompt(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="spell", messages=[{"role": "user", "content": "hi"}], max_tokens=12
    )
    assert reply.object == "chat.completion"
    (choice,) = reply.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == TEMPLATE[:12]
    assert choice.finish_reason == "length"
    stopped = client.chat.completions.create(
        model="spell", messages=[{"role": "user", "content": "hi"}], stop="\n", max_tokens=50
    )
    assert stopped.choices[0].message.content == "user: hi"
    assert stopped.choices[0].finish_reason == "stop"
    parts = client.chat.completions.create(
        model="spell",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}],
            }
        ],
        max_tokens=12,
    )
    assert parts.choices[0].message.content == TEMPLATE[:12]  # text parts, joined


def test_a_streamed_completion_comes_chunk_by_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="spell", prompt="xy", max_tokens=5, stream=True))
    assert all(chunk.object == "text_completion" for chunk in chunks)
    assert [chunk.choices[0].text for chunk in chunks] == ["x", "y", "x", "y", "x", ""]
    assert [chunk.choices[0].finish_reason for chunk in chunks] == [None] * 5 + ["length"]


def test_a_streamed_chat_begins_with_its_role_and_ends_with_usage(server: Running) -> None:
    async def main() -> list[openai.types.chat.ChatCompletionChunk]:
        async with _async_client(server) as client:
            stream = await client.chat.completions.create(
                model="spell",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
            return [chunk async for chunk in stream]

    chunks = asyncio.run(main())
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [chunk.choices[0].delta.content for chunk in chunks[1:-2]]
    assert "".join(c or "" for c in contents) == TEMPLATE[:4]
    last = chunks[-2].choices[0]
    assert (last.delta.content, last.finish_reason) == (None, "length")
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == len(TEMPLATE)  # spell counts characters


def test_each_prompt_of_a_list_gets_its_own_text(client: openai.OpenAI) -> None:
    prompts = ["ab", "xyz", "q"]
    reply = client.completions.create(model="spell", prompt=prompts, max_tokens=5)
    assert [(c.index, c.text) for c in reply.choices] == [(0, "ababa"), (1, "xyzxy"), (2, "qqqqq")]
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(
        model="spell", prompt=prompts, max_tokens=5, stream=True
    ):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {0: "ababa", 1: "xyzxy", 2: "qqqqq"}


def test_n_makes_that_many_choices_of_each_prompt(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="spell", prompt=["a", "b"], n=2, max_tokens=2)
    assert [(c.index, c.text) for c in reply.choices] == [
        (0, "aa"),
        (1, "aa"),
        (2, "bb"),
        (3, "bb"),
    ]


def test_a_stop_split_across_chunks_ends_the_text_before_it(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="spell", prompt="abc", stop=["zz", "ca"], max_tokens=50)
    assert (reply.choices[0].text, reply.choices[0].finish_reason) == ("ab", "stop")
    assert reply.usage is not None and reply.usage.completion_tokens == 4  # a b c a
    stream = client.completions.create(
        model="spell", prompt="abc", stop="ca", max_tokens=50, stream=True
    )
    texts = [chunk.choices[0].text for chunk in stream]
    assert texts == ["a", "b", ""]  # the "c" was held back, never sent


def test_a_stop_leaves_the_stream_and_frees_its_slot(
    client: openai.OpenAI, server: Running
) -> None:
    left = _left(server)
    endless = 1_000_000  # spelled for minutes, unless the stream is left
    reply = client.completions.create(model="spell-one", prompt="ab", stop="ba", max_tokens=endless)
    assert (reply.choices[0].text, reply.choices[0].finish_reason) == ("a", "stop")
    assert _spell_one_answers(client) == "oko"  # one at a time: the stopped one left
    assert _left(server) == left + 1


def test_a_client_that_disconnects_mid_stream_frees_the_slot(
    client: openai.OpenAI, server: Running
) -> None:
    left = _left(server)
    body = {"model": "spell-one", "prompt": "ab", "max_tokens": 1_000_000, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as reply:
        lines = reply.iter_lines()
        assert next(lines).startswith("data: {")  # streaming; now hang up
    assert _spell_one_answers(client) == "oko"
    assert _left(server) == left + 1


def test_models_lists_every_generator(client: openai.OpenAI) -> None:
    models = sorted(model.id for model in client.models.list())
    assert models == ["spell", "spell-on", "spell-one"]


def test_a_model_that_goes_on_past_max_tokens_is_cut_there_and_left(
    client: openai.OpenAI, server: Running
) -> None:
    left = _left(server, "spell_on")  # one at a time: each answer frees the slot
    streamed = client.completions.create(model="spell-on", prompt="ab", max_tokens=3, stream=True)
    pieces = [(chunk.choices[0].text, chunk.choices[0].finish_reason) for chunk in streamed]
    assert pieces == [("a", None), ("b", None), ("a", None), ("", "length")]
    whole = client.completions.create(model="spell-on", prompt="xy", max_tokens=3)
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == ("xyx", "length")
    assert _left(server, "spell_on") == left + 2


def test_an_unknown_model_is_404_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-nothing", prompt="x")
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "model_not_found"
    assert "gpt-nothing" in caught.value.body["message"]


@pytest.mark.parametrize(
    ("arguments", "param"),
    [
        ({"prompt": "ab", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "ab", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "ab", "n": 0}, "n"),
        ({"prompt": "ab", "max_tokens": 2_000_000}, "max_tokens"),  # over the item's limit
        ({"prompt": "x" * 65}, "prompt"),  # the item's own limit
        ({"prompt": "ab", "echo": True}, "echo"),
        ({"prompt": ["ab"] * 2049}, "prompt"),  # at most 2048 inputs, as OpenAI allows
        ({"prompt": ["ab"] * 17, "n": 128}, "n"),  # 2176 choices
    ],
)
def test_a_bad_field_is_400_naming_it(
    client: openai.OpenAI, arguments: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="spell", **arguments)  # type: ignore[call-overload]
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == param
    assert caught.value.body["type"] == "invalid_request_error"


def test_malformed_bodies_are_400_in_openais_shape(server: Running) -> None:
    for path, body in (
        ("/v1/completions", {"model": "spell", "prompt": 5}),
        ("/v1/completions", {"model": "spell", "prompt": []}),
        ("/v1/chat/completions", {"model": "spell", "messages": []}),
        ("/v1/chat/completions", {"model": "spell", "messages": [{"content": "no role"}]}),
        (
            "/v1/chat/completions",
            {"model": "spell", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        ),
    ):
        reply = httpx.post(f"{server.url}{path}", json=body)
        assert reply.status_code == 400, body
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_an_item_error_mid_stream_raises_api_error(client: openai.OpenAI) -> None:
    got = []
    with pytest.raises(openai.APIError, match="spelled a '!'"):
        for chunk in client.completions.create(
            model="spell", prompt="ab!", max_tokens=10, stream=True
        ):
            got.append(chunk.choices[0].text)
    assert got == ["a", "b"]


def test_a_deadline_before_the_first_chunk_is_504(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(
            model="spell",
            prompt="~",
            stream=True,
            extra_headers={"X-Request-Timeout-Ms": "50"},
        )
    assert caught.value.status_code == 504


def test_several_http_processes_relay_completions_to_the_one_service() -> None:
    with (
        serving(
            "tests.protocols.models:spell", options=("--workers", "2", "--log-level", "warning")
        ) as running,
        openai.OpenAI(base_url=f"{running.url}/v1", api_key="-", max_retries=0) as client,
    ):
        stream = client.completions.create(model="spell", prompt="ab", max_tokens=3, stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream) == "aba"
        reply = client.chat.completions.create(
            model="spell", messages=[{"role": "user", "content": "hi"}], stop=":", max_tokens=9
        )
        assert reply.choices[0].message.content == "user"


def _speller(**settings: int) -> microbatch.Service[object, object]:
    service: microbatch.Service[object, object] = microbatch.Service(
        microbatch.Stage(Speller, mode="thread", max_batch_size=4), name="spell", **settings
    )
    service.completion_model = CompletionModel()  # type: ignore[attr-defined]
    return service


async def test_a_plain_asgi_app_serves_completions_behind_its_token() -> None:
    app = HttpApp(_speller(), HttpConfig(auth_token="sesame"))
    async with (
        serving_in_process(app) as http,
        openai.AsyncOpenAI(
            base_url="http://test/v1", api_key="sesame", http_client=http, max_retries=0
        ) as client,
    ):
        reply = await client.completions.create(model="spell", prompt="ab", max_tokens=3)
        assert reply.choices[0].text == "aba"
        stream = await client.chat.completions.create(
            model="spell", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        content = "".join([c.choices[0].delta.content or "" async for c in stream])
        assert content == TEMPLATE[:16]  # Spell's own max_tokens
        with pytest.raises(openai.AuthenticationError):
            await client.completions.create(
                model="spell", prompt="ab", extra_headers={"Authorization": "Bearer wrong"}
            )


async def test_prompts_past_the_services_limit_are_503_and_leave_no_stream() -> None:
    app = HttpApp(_speller(max_in_flight=2), HttpConfig())
    async with (
        serving_in_process(app) as http,
        openai.AsyncOpenAI(
            base_url="http://test/v1", api_key="-", http_client=http, max_retries=0
        ) as client,
    ):
        with pytest.raises(openai.APIStatusError) as caught:
            await client.completions.create(model="spell", prompt=["a", "b", "c"])
        assert caught.value.status_code == 503
        reply = await client.completions.create(model="spell", prompt=["a", "b"], max_tokens=1)
        assert [c.text for c in reply.choices] == ["a", "b"]


@pytest.mark.parametrize(
    ("route", "asked"),
    [
        ("completions", {"prompt": "xyz", "max_tokens": 7}),
        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}),
        ("completions", {"prompt": "x!", "max_tokens": 7}),  # fails at its second chunk
    ],
)
def test_one_choice_written_straight_sends_what_a_general_answer_sends(
    server: Running, route: str, asked: dict[str, object]
) -> None:
    def events(**more: object) -> list[object]:
        body = {"model": "spell", "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{server.url}/v1/{route}", json={**body, **asked, **more}) as r:
            lines = [line for line in r.iter_lines() if line]
        assert all(line.startswith("data: ") for line in lines)
        decoded: list[object] = []
        for line in lines:
            if line == "data: [DONE]":
                decoded.append(line)
                continue
            event = json.loads(line.removeprefix("data: "))
            event.pop("id", None)  # the request's own
            event.pop("created", None)
            decoded.append(event)
        return decoded

    straight = events()  # one choice, no stop: written straight from its stream
    general = events(stop="\x01")  # a stop that never comes: every choice read by a task
    assert straight == general
    if "!" in str(asked):  # the item's error is the last event
        assert "spelled a '!'" in json.dumps(straight[-1])
    else:
        assert straight[-1] == "data: [DONE]"
        assert straight[-2]["usage"]["completion_tokens"] == 7  # type: ignore[index]
