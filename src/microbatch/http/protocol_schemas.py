"""The JSON schemas of the protocol routes' bodies, as OpenAPI components: the Open
Inference Protocol v2 (server and model metadata, inference request and response) and
OpenAI's embeddings (request, response, the model list). They are written by hand:
those bodies are built by :mod:`.inference_v2` and :mod:`.openai`, not by msgspec types."""

from __future__ import annotations

from typing import Any

__all__ = ["ANY_ERROR", "OPENAI_SCHEMAS", "V2_SCHEMAS"]

ANY_ERROR = {
    "type": "object",
    "description": '``{"error": message}`` (v2), ``{"error": {...}}`` (OpenAI), or'
    ' the server\'s own error body (``{"error", "message"}``)',
    "properties": {"error": {"type": ["string", "object"]}},
    "required": ["error"],
}
"""The error body of a protocol route: each protocol words its errors its own way."""
_PARAMETERS = {"type": "object", "description": "free-form parameters"}
_SHAPE = {"type": "array", "items": {"type": "integer"}}
_TENSOR_METADATA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "datatype": {"type": "string"}, "shape": _SHAPE},
    "required": ["name", "datatype", "shape"],
}
V2_SCHEMAS: dict[str, Any] = {
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
"""The v2 bodies, by component name."""
OPENAI_SCHEMAS: dict[str, Any] = {
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
"""The OpenAI bodies, by component name."""
