"""The protocol routes in the OpenAPI document: v2 inference for every model,
``/v1/embeddings`` and ``/v1/models`` for an embedding model; the answers of a real
server match the documented schemas (schemathesis, the official clients' shapes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from microbatch.http import app
from tests.protocols import models as protocol_models
from tests.serve.test_server import Server, running

from . import models


@pytest.mark.parametrize("token", [None, "t"])
def test_v2_routes_are_documented_with_their_schemas(token: str | None) -> None:
    document = app(models.halve, auth_token=token).openapi
    validate(document)
    infer = document["paths"]["/v2/models/halve/infer"]["post"]
    body = infer["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/V2InferenceRequest"}
    request = document["components"]["schemas"]["V2InferenceRequest"]
    assert request["required"] == ["inputs"]
    assert {"400", "413", "503", "504"} <= set(infer["responses"])
    assert ("401" in infer["responses"]) is (token is not None)
    for path in ("/v2/models/halve/generate", "/v2/models/halve/versions/1/generate_stream"):
        generate = document["paths"][path]["post"]
        body = generate["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/V2GenerateRequest"}
    stream = document["paths"]["/v2/models/halve/generate_stream"]["post"]
    assert set(stream["responses"]["200"]["content"]) == {"text/event-stream"}
    live = document["paths"]["/v2/health/live"]["get"]
    assert "security" not in live  # probes need no token
    assert "/v1/embeddings" not in document["paths"]  # halve is no embedding model


def test_embedding_routes_are_documented_for_an_embedding_model() -> None:
    document = app(protocol_models.embed).openapi
    validate(document)
    post = document["paths"]["/v1/embeddings"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/EmbeddingsRequest"}
    schemas = document["components"]["schemas"]
    assert schemas["EmbeddingsRequest"]["required"] == ["input", "model"]
    assert schemas["EmbeddingsResponse"]["required"] == ["object", "data", "model", "usage"]
    assert "/v1/models" in document["paths"]


def test_completion_routes_are_documented_for_a_text_generator() -> None:
    document = app(protocol_models.spell).openapi
    validate(document)
    paths = document["paths"]
    assert "/v1/embeddings" not in paths and "/v1/models" in paths
    for path, request in (
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatCompletionRequest"),
    ):
        post = paths[path]["post"]
        body = post["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{request}"}
        assert set(post["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert document["components"]["schemas"]["ChatCompletionRequest"]["required"] == [
        "model",
        "messages",
    ]


schema = schemathesis.openapi.from_dict(app(protocol_models.embed).openapi).include(
    path_regex="^/v1/"
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running("tests.protocols.models:embed", "--log-level", "warning") as started:
        yield started


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_embedding_routes_answer_as_documented(case: schemathesis.Case, server: Server) -> None:
    # An input's tokens must be in the vocabulary and within the model's length:
    # a schema-valid request may rightly be 400; a 5xx only for a tiny deadline.
    response = case.call_and_validate(
        base_url=server.url,
        timeout=30,
        excluded_checks=[not_a_server_error, positive_data_acceptance],
    )
    lowered_deadline = any(name.lower() == "x-request-timeout-ms" for name in case.headers or {})
    assert response.status_code < 500 or (response.status_code == 504 and lowered_deadline)
