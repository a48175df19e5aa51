"""The OpenAPI document of a served model, from its declared item types, and a
small self-contained HTML page that shows it (no scripts, no external assets)."""

from __future__ import annotations

import html
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .codecs import encode_hook, is_pydantic_model
from .status import ErrorBody

__all__ = ["add_protocol_operations", "docs_page", "openapi_document"]

_MEDIA_TYPES = ("application/json", "application/msgpack")
_REF = "#/components/schemas/{name}"

logger = logging.getLogger("microbatch.http")


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

    def errors(*statuses: tuple[str, str]) -> dict[str, Any]:
        return {code: {"description": text, "content": content(error)} for code, text in statuses}

    security: list[dict[str, list[str]]] = [{"bearer": []}] if auth else []

    def operation(summary: str, operation_id: str, item: Any, result: Any) -> dict[str, Any]:
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
            "requestBody": {"required": True, "content": content(item)},
            "responses": {
                "200": {"description": "The item's result", "content": content(result)},
                **errors(
                    ("400", "Malformed body or header"),
                    ("406", "Accept names neither JSON nor msgpack"),
                    ("408", "The body arrived too slowly"),
                    ("413", "The body is over the size limit"),
                    ("415", "Content-Type is neither JSON nor msgpack"),
                    ("422", "The body does not match the item type"),
                    ("500", "The model failed for this item"),
                    ("503", "Overloaded, not ready or shutting down; retry after Retry-After"),
                    ("504", "The request's deadline passed"),
                ),
                **(errors(("401", "Missing or wrong bearer token")) if auth else {}),
            },
            "security": security,
        }

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
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            **paths,
            "/health/live": {"get": {"summary": "The process is up", "responses": probe}},
            "/health/ready": {
                "get": {
                    "summary": "Ready for traffic",
                    "responses": {**probe, **errors(("503", "Not ready"))},
                }
            },
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": text}},
        },
        "components": {"schemas": components},
    }
    if auth:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["paths"]["/metrics"]["get"]["security"] = security
    return document


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


def docs_page(document: dict[str, Any]) -> bytes:
    """A small HTML page listing every route with its request and response schemas."""
    title = html.escape(str(document["info"]["title"]))
    sections = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            rows = "".join(
                f"<li><b>{html.escape(code)}</b> {html.escape(str(response['description']))}</li>"
                for code, response in operation["responses"].items()
            )
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            request = _pre(body["schema"]) if body else ""
            sections.append(
                f"<section><h2><code>{method.upper()} {html.escape(path)}</code></h2>"
                f"<p>{html.escape(operation.get('summary', ''))}</p>{request}<ul>{rows}</ul>"
                "</section>"
            )
    schemas = _pre(document["components"]["schemas"])
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>body{{font-family:sans-serif;max-width:60em;margin:auto}}"
        "pre{background:#f4f4f4;padding:1em;overflow:auto}</style></head><body>"
        f"<h1>{title}</h1><p>Bodies are JSON or msgpack (<code>Content-Type</code>, "
        "<code>Accept</code>). The full document is at <a href='openapi.json'>openapi.json</a>."
        f"</p>{''.join(sections)}<h2>Schemas</h2>{schemas}</body></html>"
    ).encode()


def _pre(value: Any) -> str:
    text = msgspec.json.format(msgspec.json.encode(value)).decode()
    return f"<pre>{html.escape(text)}</pre>"


# -- the protocol routes: KServe/Triton v2 and OpenAI embeddings ------------------------

_ANY_ERROR = {
    "type": "object",
    "description": '``{"error": message}`` (v2), ``{"error": {...}}`` (OpenAI), or'
    ' the server\'s own error body (``{"error", "message"}``)',
    "properties": {"error": {"type": ["string", "object"]}},
    "required": ["error"],
}
_PARAMETERS = {"type": "object", "description": "free-form parameters"}
_SHAPE = {"type": "array", "items": {"type": "integer"}}
_TENSOR_METADATA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "datatype": {"type": "string"}, "shape": _SHAPE},
    "required": ["name", "datatype", "shape"],
}
_V2_SCHEMAS: dict[str, Any] = {
    "V2ServerMetadata": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "extensions": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "version", "extensions"],
    },
    "V2ModelMetadata": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array", "items": _TENSOR_METADATA},
            "outputs": {"type": "array", "items": _TENSOR_METADATA},
        },
        "required": ["name", "versions", "platform", "inputs", "outputs"],
    },
    "V2InferenceRequest": {
        "type": "object",
        "description": "A v2 inference request: each row of the inputs is one item",
        "properties": {
            "id": {"type": ["string", "null"]},
            "parameters": _PARAMETERS,
            "inputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "shape": _SHAPE,
                        "datatype": {"type": "string"},
                        "parameters": _PARAMETERS,
                        "data": {"description": "the tensor's elements, flat or nested"},
                    },
                    "required": ["name", "shape", "datatype"],
                },
            },
            "outputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS},
                    "required": ["name"],
                },
            },
        },
        "required": ["inputs"],
    },
    "V2InferenceResponse": {
        "type": "object",
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": ["string", "null"]},
            "outputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "datatype": {"type": "string"},
                        "shape": _SHAPE,
                        "data": {"type": "array"},
                        "parameters": _PARAMETERS,
                    },
                    "required": ["name", "datatype", "shape"],
                },
            },
        },
        "required": ["model_name", "outputs"],
    },
}
_OPENAI_SCHEMAS: dict[str, Any] = {
    "EmbeddingsRequest": {
        "type": "object",
        "properties": {
            "input": {
                "description": "a string, a list of strings, or token arrays",
                "anyOf": [{"type": "string"}, {"type": "array"}],
            },
            "model": {"type": "string"},
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": {"type": ["integer", "null"]},
            "user": {"type": ["string", "null"]},
        },
        "required": ["input", "model"],
    },
    "EmbeddingsResponse": {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer"},
                        "embedding": {
                            "description": "numbers, or base64 of little-endian float32",
                            "anyOf": [
                                {"type": "array", "items": {"type": "number"}},
                                {"type": "string"},
                            ],
                        },
                    },
                    "required": ["object", "index", "embedding"],
                },
            },
            "model": {"type": "string"},
            "usage": {
                "type": "object",
                "properties": {
                    "prompt_tokens": {"type": "integer"},
                    "total_tokens": {"type": "integer"},
                },
                "required": ["prompt_tokens", "total_tokens"],
            },
        },
        "required": ["object", "data", "model", "usage"],
    },
    "ModelList": {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "model"},
                        "created": {"type": "integer"},
                        "owned_by": {"type": "string"},
                    },
                    "required": ["id", "object", "created", "owned_by"],
                },
            },
        },
        "required": ["object", "data"],
    },
}


def add_protocol_operations(
    document: dict[str, Any], *, v2_models: Sequence[str], embeddings: bool, auth: bool
) -> None:
    """Document the v2 inference routes of ``v2_models`` and, with ``embeddings``,
    ``POST /v1/embeddings`` and ``GET /v1/models`` in ``document`` (an
    :func:`openapi_document`)."""
    security: list[dict[str, list[str]]] = [{"bearer": []}] if auth else []
    schemas = document["components"]["schemas"]
    paths = document["paths"]

    def ref(name: str) -> dict[str, Any]:
        return {"$ref": _REF.format(name=name)}

    def json_body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"application/json": {"schema": schema}}

    def errors(*statuses: tuple[str, str]) -> dict[str, Any]:
        every = [*statuses, *([("401", "Missing or wrong bearer token")] if auth else [])]
        return {
            code: {"description": text, "content": json_body(_ANY_ERROR)} for code, text in every
        }

    def get(summary: str, operation_id: str, schema: dict[str, Any], *, secured: bool) -> Any:
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": operation_id,
            "responses": {
                "200": {"description": "OK", "content": json_body(schema)},
                **errors(("503", "Not ready")),
            },
        }
        if secured:
            operation["security"] = security
        return {"get": operation}

    def post(summary: str, operation_id: str, item: str, result: str) -> Any:
        return {
            "post": {
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
                "requestBody": {"required": True, "content": json_body(ref(item))},
                "responses": {
                    "200": {"description": "The results", "content": json_body(ref(result))},
                    **errors(
                        ("400", "Malformed body, tensor or parameter"),
                        ("404", "Unknown model"),
                        ("408", "The body arrived too slowly"),
                        ("413", "The body is over the size limit"),
                        ("422", "An item does not match the model's item type"),
                        ("500", "The model failed"),
                        ("503", "Overloaded, not ready or shutting down"),
                        ("504", "The request's deadline passed"),
                    ),
                },
                "security": security,
            }
        }

    flag = {"type": "object", "additionalProperties": {"type": "boolean"}}
    if v2_models:
        schemas.update(_V2_SCHEMAS)
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
    if embeddings:
        schemas.update(_OPENAI_SCHEMAS)
        paths["/v1/embeddings"] = post(
            "OpenAI-compatible embeddings", "embeddings", "EmbeddingsRequest", "EmbeddingsResponse"
        )
        paths["/v1/models"] = get("OpenAI: the models", "models", ref("ModelList"), secured=True)
