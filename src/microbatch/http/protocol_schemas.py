"""The JSON schemas of the protocol routes' bodies, as OpenAPI components: the Open
Inference Protocol v2 (server and model metadata, inference request and response,
the generate extension's request and answer) and OpenAI's embeddings (request,
response, the model list) and completions (the completion and chat requests, their
answer). They are written by hand: those bodies are built by :mod:`.inference_v2`,
:mod:`.generate`, :mod:`.openai` and :mod:`.completion_answers`, not by msgspec
types."""

from __future__ import annotations

from typing import Any

__all__ = ["ANY_ERROR", "COMPLETION_SCHEMAS", "OPENAI_SCHEMAS", "V2_SCHEMAS"]

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
    "V2GenerateRequest": {
        "type": "object",
        "description": "Triton's generate extension: each input by name, a plain JSON value"
        " (a scalar, or a list for one row of a tensor); parameters are ignored",
        "properties": {"parameters": _PARAMETERS},
        "additionalProperties": True,
    },
    "V2GenerateResponse": {
        "type": "object",
        "description": "each output by name, a plain JSON value",
        "properties": {"model_name": {"type": "string"}, "model_version": {"type": "string"}},
        "required": ["model_name", "model_version"],
        "additionalProperties": True,
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

_STOP = {
    "description": "up to 4 stop sequences: the text ends before the first",
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
        {"type": "null"},
    ],
}
_GENERATION = {
    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "stop": _STOP,
    "n": {"type": "integer", "minimum": 1, "maximum": 128, "description": "choices per prompt"},
    "stream": {"type": "boolean", "description": "Server-Sent Events as the text is made"},
    "stream_options": {
        "type": ["object", "null"],
        "properties": {"include_usage": {"type": "boolean"}},
    },
    "user": {"type": ["string", "null"]},
}
_USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer", "description": "the chunks made"},
        "total_tokens": {"type": "integer"},
    },
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
}
COMPLETION_SCHEMAS: dict[str, Any] = {
    "CompletionRequest": {
        "type": "object",
        "properties": {
            "model": {"type": "string"},
            "prompt": {
                "description": "a prompt, or a list of them (a choice each)",
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                ],
            },
            **_GENERATION,
        },
        "required": ["model", "prompt"],
    },
    "ChatCompletionRequest": {
        "type": "object",
        "properties": {
            "model": {"type": "string"},
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "role": {"type": "string"},
                        "content": {"anyOf": [{"type": "string"}, {"type": "array"}]},
                    },
                    "required": ["role"],
                },
            },
            "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
            **_GENERATION,
        },
        "required": ["model", "messages"],
    },
    "Completion": {
        "type": "object",
        "description": "a text_completion, or a chat.completion (choices with a message)",
        "properties": {
            "id": {"type": "string"},
            "object": {"enum": ["text_completion", "chat.completion"]},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer"},
                        "text": {"type": "string"},
                        "message": {"type": "object"},
                        "finish_reason": {"enum": ["stop", "length"]},
                    },
                    "required": ["index", "finish_reason"],
                },
            },
            "usage": _USAGE,
        },
        "required": ["id", "object", "created", "model", "choices", "usage"],
    },
}
"""The OpenAI completion bodies, by component name."""
