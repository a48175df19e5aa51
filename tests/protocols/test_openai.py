"""OpenAI-compatible embeddings, spoken by the official ``openai`` client against a real
``microbatch serve``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest

from .conftest import Running, serving
from .models import expected_vector


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with serving("tests.protocols.models:embed", options=("--log-level", "warning")) as running:
        yield running


@pytest.fixture
def client(server: Running) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(a - b) < 1e-6 for a, b in zip(got, want, strict=True))


def test_one_string(client: openai.OpenAI) -> None:
    reply = client.embeddings.create(model="embed", input="hello world", encoding_format="float")
    assert reply.model == "embed"
    assert [item.index for item in reply.data] == [0]
    assert _close(reply.data[0].embedding, expected_vector("hello world"))
    assert reply.usage.prompt_tokens == 4  # [CLS] hello world [SEP]
    assert reply.usage.total_tokens == 4


def test_a_list_of_strings_in_base64(client: openai.OpenAI) -> None:
    texts = ["one", "two", "three"]
    reply = client.embeddings.create(model="embed", input=texts)  # the client asks for base64
    assert [item.index for item in reply.data] == [0, 1, 2]
    for item, text in zip(reply.data, texts, strict=True):
        assert _close(item.embedding, expected_vector(text))


def test_base64_on_the_wire(server: Running) -> None:
    body = {"model": "embed", "input": ["abc"], "encoding_format": "base64"}
    reply = httpx.post(f"{server.url}/v1/embeddings", json=body).json()
    assert isinstance(reply["data"][0]["embedding"], str)


def test_token_arrays_are_decoded_by_the_models_tokenizer(client: openai.OpenAI) -> None:
    ids = [7592, 2088]  # "hello world" in MiniLM's vocabulary
    reply = client.embeddings.create(model="embed", input=[ids], encoding_format="float")
    assert _close(reply.data[0].embedding, expected_vector("hello world"))
    flat = client.embeddings.create(model="embed", input=ids, encoding_format="float")
    assert _close(flat.data[0].embedding, expected_vector("hello world"))


def test_a_token_outside_the_vocabulary_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embed", input=[[1, 10**9]])
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "invalid_token"
    assert error["type"] == "invalid_request_error"


def test_an_unknown_model_is_404_in_openais_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="gpt-nothing", input="x")
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "model_not_found"
    assert "gpt-nothing" in caught.value.body["message"]


def test_a_too_long_input_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embed", input=["short", "word " * 40])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert "input 1" in caught.value.body["message"]


def test_malformed_inputs_are_400(server: Running) -> None:
    for body in (
        {"model": "embed", "input": []},
        {"model": "embed", "input": [""]},
        {"model": "embed", "input": [1.5]},
        {"model": "embed"},
        {"model": "embed", "input": "x", "encoding_format": "int8"},
    ):
        reply = httpx.post(f"{server.url}/v1/embeddings", json=body)
        assert reply.status_code == 400, body
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_more_inputs_than_openai_allows_are_400(server: Running) -> None:
    body = {"model": "embed", "input": ["x"] * 2049}  # one request may not take the queue
    reply = httpx.post(f"{server.url}/v1/embeddings", json=body)
    assert reply.status_code == 400
    assert "2048" in reply.json()["error"]["message"]


def test_models_are_listed(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == ["embed"]


def test_concurrent_clients_each_get_their_own_embeddings(server: Running) -> None:
    async def main() -> list[tuple[list[str], openai.types.CreateEmbeddingResponse]]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0
        ) as client:
            inputs = [[f"text {n}", f"other {n}"] for n in range(48)]
            replies = await asyncio.gather(
                *(client.embeddings.create(model="embed", input=texts) for texts in inputs)
            )
            return list(zip(inputs, replies, strict=True))

    for texts, reply in asyncio.run(main()):
        for item, text in zip(reply.data, texts, strict=True):
            assert _close(item.embedding, expected_vector(text))


def test_a_model_without_a_tokenizer_counts_words_and_refuses_tokens() -> None:
    with (
        serving(
            "tests.protocols.models:embed_words", options=("--log-level", "warning")
        ) as running,
        openai.OpenAI(base_url=f"{running.url}/v1", api_key="-", max_retries=0) as client,
    ):
        reply = client.embeddings.create(model="embed_words", input="three words here")
        assert reply.usage.prompt_tokens == 3
        assert _close(reply.data[0].embedding, expected_vector("three words here"))
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="embed_words", input=[[1, 2]])


def test_a_service_that_is_no_embedding_model_has_no_v1_routes() -> None:
    with serving("tests.protocols.models:double", options=("--log-level", "warning")) as running:
        assert httpx.get(f"{running.url}/v1/models").status_code == 404


def test_the_embedding_example_declares_itself_an_embedding_model() -> None:
    from examples import embeddings
    from microbatch.http.openai import embedding_model_of

    declared = embedding_model_of(embeddings.service)
    assert declared is not None
    assert declared.max_input_tokens == embeddings.MAX_TOKENS
    assert declared.loaded_tokenizer.encode("hello world").ids == [101, 7592, 2088, 102]


def test_a_passed_deadline_is_504_in_openais_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.embeddings.create(
            model="embed", input="slow", extra_headers={"X-Request-Timeout-Ms": "100"}
        )
    assert caught.value.status_code == 504
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "server_error"
