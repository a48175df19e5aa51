"""The OpenAPI document of a served model, from its declared item types
(:func:`openapi_document`), and the protocol routes added to it
(:func:`add_protocol_operations`). Both build their ``POST`` operations and error
responses with the same helpers; the protocol bodies' schemas are in
:mod:`.protocol_schemas`, and the HTML page that shows a document in :mod:`.docs_page`."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from .codecs import encode_hook, is_pydantic_model
from .docs_page import docs_page
from .protocol_schemas import ANY_ERROR, COMPLETION_SCHEMAS, OPENAI_SCHEMAS, V2_SCHEMAS
from .status import ErrorBody

__all__ = ["add_protocol_operations", "docs_page", "openapi_document"]

_MEDIA_TYPES = ("application/json", "application/msgpack")
_REF = "#/components/schemas/{name}"
_UNAUTHORISED = ("401", "Missing or wrong bearer token")

logger = logging.getLogger("microbatch.http")

_Content = Callable[[dict[str, Any]], dict[str, Any]]
"""A schema as a body's ``content``: by media type (a fresh dict on every call)."""


def openapi_document(
    title: str,
    version: str,
    input_type: Any,
    output_type: Any,
    *,
    auth: bool,
    routes: Mapping[str, tuple[Any, Any]] | None = None,
    examples: Sequence[Any] = (),
) -> dict[str, Any]:
    """An OpenAPI 3.1 document for ``POST /predict`` and the operational routes.

    Args:
        title: The API's title (the model's name).
        version: The API's version.
        input_type: The type of one item (the request body).
        output_type: The type of one result (the response body).
        auth: Predict and the other non-probe routes need a bearer token.
        routes: More entry points, ``POST /predict/{name}``: their item and result types.
        examples: Example items of ``POST /predict`` (a Service's warm-up ``examples``),
            published as the JSON request body's ``examples``; ``microbatch bench``
            sends them. One that cannot be written as JSON is left out (and logged).
    """
    routes = dict(routes or {})
    pydantic_defs: dict[str, Any] = {}

    def schema_hook(kind: type) -> dict[str, Any]:
        if is_pydantic_model(kind):
            schema: dict[str, Any] = kind.model_json_schema(  # type: ignore[attr-defined]
                ref_template=_REF.replace("{name}", "{model}")
            )
            pydantic_defs.update(schema.pop("$defs", {}))
            return schema
        return _schema_hook(kind)

    route_types = [kind for pair in routes.values() for kind in pair]
    (item, result, error, *route_schemas), components = msgspec.json.schema_components(
        [input_type, output_type, ErrorBody, *route_types],
        schema_hook=schema_hook,
        ref_template=_REF,
    )
    components = {**pydantic_defs, **components}

    def content(schema: dict[str, Any]) -> dict[str, Any]:
        return {media_type: {"schema": schema} for media_type in _MEDIA_TYPES}

    security = _security(auth)
    statuses = (
        ("400", "Malformed body or header"),
        ("406", "Accept names neither JSON nor msgpack"),
        ("408", "The body arrived too slowly"),
        ("413", "The body is over the size limit"),
        ("415", "Content-Type is neither JSON nor msgpack"),
        ("422", "The body does not match the item type"),
        ("500", "The model failed for this item"),
        ("503", "Overloaded, not ready or shutting down; retry after Retry-After"),
        ("504", "The request's deadline passed"),
        *((_UNAUTHORISED,) if auth else ()),
    )

    def operation(summary: str, operation_id: str, item: Any, result: Any) -> dict[str, Any]:
        return _post(
            summary,
            operation_id,
            content(item),
            {"description": "The item's result", "content": content(result)},
            _errors(statuses, content, error),
            security,
        )

    predict = operation("One item in, its own result out", "predict", item, result)
    published = _json_examples(examples)
    if published:
        predict["requestBody"]["content"]["application/json"]["examples"] = published
    paths: dict[str, Any] = {"/predict": {"post": predict}}
    pairs = zip(routes, route_schemas[::2], route_schemas[1::2], strict=True)
    for name, route_item, route_result in pairs:
        summary = f"One item into {name} alone, its own result out"
        paths[f"/predict/{name}"] = {
            "post": operation(summary, f"predict_{name}", route_item, route_result)
        }
    status = {
        "type": "object",
        "properties": {"status": {"type": "string"}},
        "required": ["status"],
    }
    probe = {"200": {"description": "OK", "content": {"application/json": {"schema": status}}}}
    text = {"200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}}
    not_ready = _errors((("503", "Not ready"),), content, error)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            **paths,
            "/health/live": {"get": {"summary": "The process is up", "responses": probe}},
            "/health/ready": {
                "get": {"summary": "Ready for traffic", "responses": {**probe, **not_ready}}
            },
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": text}},
        },
        "components": {"schemas": components},
    }
    if auth:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["paths"]["/metrics"]["get"]["security"] = security
    return document


def add_protocol_operations(
    document: dict[str, Any],
    *,
    v2_models: Sequence[str],
    embeddings: bool,
    auth: bool,
    completions: bool = False,
) -> None:
    """Document the v2 inference routes of ``v2_models``; with ``embeddings``,
    ``POST /v1/embeddings``; with ``completions``, ``POST /v1/completions`` and
    ``POST /v1/chat/completions``; with either, ``GET /v1/models``; in ``document``
    (an :func:`openapi_document`)."""
    security = _security(auth)
    schemas = document["components"]["schemas"]
    paths = document["paths"]
    unauthorised = (_UNAUTHORISED,) if auth else ()

    def ref(name: str) -> dict[str, Any]:
        return {"$ref": _REF.format(name=name)}

    def json_body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"application/json": {"schema": schema}}

    def get(summary: str, operation_id: str, schema: dict[str, Any], *, secured: bool) -> Any:
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": operation_id,
            "responses": {
                "200": {"description": "OK", "content": json_body(schema)},
                **_errors((("503", "Not ready"), *unauthorised), json_body, ANY_ERROR),
            },
        }
        if secured:
            operation["security"] = security
        return {"get": operation}

    statuses = (
        ("400", "Malformed body, tensor or parameter"),
        ("404", "Unknown model"),
        ("408", "The body arrived too slowly"),
        ("413", "The body is over the size limit"),
        ("422", "An item does not match the model's item type"),
        ("500", "The model failed"),
        ("503", "Overloaded, not ready or shutting down"),
        ("504", "The request's deadline passed"),
        *unauthorised,
    )

    def post(summary: str, operation_id: str, item: str, result: str) -> Any:
        return {
            "post": _post(
                summary,
                operation_id,
                json_body(ref(item)),
                {"description": "The results", "content": json_body(ref(result))},
                _errors(statuses, json_body, ANY_ERROR),
                security,
            )
        }

    flag = {"type": "object", "additionalProperties": {"type": "boolean"}}
    if v2_models:
        schemas.update(V2_SCHEMAS)
        paths["/v2"] = get("v2 server metadata", "v2_server", ref("V2ServerMetadata"), secured=True)
        paths["/v2/health/live"] = get("v2: the process is up", "v2_live", flag, secured=False)
        paths["/v2/health/ready"] = get("v2: every model is ready", "v2_ready", flag, secured=False)
    for name in v2_models:
        for number, base in enumerate((f"/v2/models/{name}", f"/v2/models/{name}/versions/1")):
            suffix = f"{name}{'_v1' if number else ''}"
            paths[base] = get(
                f"v2 metadata of {name}",
                f"v2_metadata_{suffix}",
                ref("V2ModelMetadata"),
                secured=True,
            )
            paths[f"{base}/ready"] = get(
                f"v2: {name} is ready", f"v2_model_ready_{suffix}", flag, secured=False
            )
            paths[f"{base}/infer"] = post(
                f"v2 inference with {name}: each row one item",
                f"v2_infer_{suffix}",
                "V2InferenceRequest",
                "V2InferenceResponse",
            )
            paths[f"{base}/generate"] = post(
                f"generate with {name}: one item, its outputs (a stream's joined)",
                f"v2_generate_{suffix}",
                "V2GenerateRequest",
                "V2GenerateResponse",
            )
            stream = post(
                f"generate with {name}: one item, each chunk's outputs as an event",
                f"v2_generate_stream_{suffix}",
                "V2GenerateRequest",
                "V2GenerateResponse",
            )
            stream["post"]["responses"]["200"] = {
                "description": "data: {V2GenerateResponse} per chunk; an error's last",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
            paths[f"{base}/generate_stream"] = stream
    if embeddings or completions:
        schemas.update(OPENAI_SCHEMAS)
        paths["/v1/models"] = get("OpenAI: the models", "models", ref("ModelList"), secured=True)
    if embeddings:
        paths["/v1/embeddings"] = post(
            "OpenAI-compatible embeddings", "embeddings", "EmbeddingsRequest", "EmbeddingsResponse"
        )
    if completions:
        schemas.update(COMPLETION_SCHEMAS)
        for path, summary, operation_id, request in (
            (
                "/v1/completions",
                "OpenAI-compatible completions",
                "completions",
                "CompletionRequest",
            ),
            ("/v1/chat/completions", "OpenAI-compatible chat", "chat", "ChatCompletionRequest"),
        ):
            operation = post(summary, operation_id, request, "Completion")
            content = operation["post"]["responses"]["200"]["content"]
            content["text/event-stream"] = {
                "schema": {"type": "string", "description": "with stream: data: {chunk}, [DONE]"}
            }
            paths[path] = operation


def _security(auth: bool) -> list[dict[str, list[str]]]:
    return [{"bearer": []}] if auth else []


def _post(
    summary: str,
    operation_id: str,
    body: dict[str, Any],
    ok: dict[str, Any],
    errors: dict[str, Any],
    security: list[dict[str, list[str]]],
) -> dict[str, Any]:
    """A ``POST`` operation: a required body, the deadline header, its 200 and errors."""
    return {
        "summary": summary,
        "operationId": operation_id,
        "parameters": [
            {
                "name": "X-Request-Timeout-Ms",
                "in": "header",
                "required": False,
                "description": "Lower the request's deadline (milliseconds)",
                "schema": {"type": "number", "exclusiveMinimum": 0},
            }
        ],
        "requestBody": {"required": True, "content": body},
        "responses": {"200": ok, **errors},
        "security": security,
    }


def _errors(
    statuses: Sequence[tuple[str, str]], content: _Content, schema: dict[str, Any]
) -> dict[str, Any]:
    """Error responses by status: each its description and the error body's schema."""
    return {code: {"description": text, "content": content(schema)} for code, text in statuses}


def _json_examples(examples: Sequence[Any]) -> dict[str, Any]:
    """OpenAPI example objects (``{"example1": {"value": ...}}``) of the items that can
    be written as JSON."""
    published: dict[str, Any] = {}
    for number, example in enumerate(examples, 1):
        try:
            value = msgspec.to_builtins(example, enc_hook=encode_hook)
            msgspec.json.encode(value)
        except (TypeError, ValueError, NotImplementedError, OverflowError) as error:
            logger.warning("example %d is not published in OpenAPI: %s", number, error)
            continue
        published[f"example{number}"] = {"value": value}
    return published


def _schema_hook(kind: type) -> dict[str, Any]:
    numpy = sys.modules.get("numpy")
    if numpy is not None and kind is numpy.ndarray:
        return {"type": "array", "description": "a numpy array, as nested lists of numbers"}
    return {"description": f"{getattr(kind, '__name__', kind)} (no schema declared)"}
