"""OpenAI-compatible embeddings: ``POST /v1/embeddings`` (``GET /v1/models`` lists
them, see :mod:`.openai_routes`).

Served for the services that declare themselves embedding models: their
``embedding_model`` attribute is an :class:`EmbeddingModel`. A service's item is
built from each input text (the item type is ``str``, or a record with a ``str``
field) and its result read as a vector (a list or array of floats, or the first
such field of a record). Each input of a list is one item in the batcher, batched
with everyone else's; a request's deadline, token, limits and overload answers are
those of ``/predict``. Errors have OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any

import msgspec
import numpy as np

from ..inference import submit_all
from ..signature import field_values, record_fields
from ..types import Servable, deadline_from
from .asgi import Receive, Scope, Send, send_response
from .openai_errors import MAX_INPUTS, OpenAIError, send_error, unknown_model
from .routing import (
    CLIENT_CLOSED,
    ClientGone,
    Handler,
    RouteHost,
    RouteTable,
    admitted_body,
    until_disconnect,
)

__all__ = [
    "EMBEDDING_MODEL_ATTRIBUTE",
    "EmbeddingModel",
    "embedding_model_of",
    "embedding_routes",
]

EMBEDDING_MODEL_ATTRIBUTE = "embedding_model"
"""The attribute of a servable that declares it an embedding model."""

_JSON = b"application/json"


@dataclass(frozen=True)
class EmbeddingModel:
    """Declares a servable an embedding model: set it as the servable's
    ``embedding_model`` attribute, and ``/v1/embeddings`` serves it.

    Args:
        max_input_tokens: The longest input, in tokens: a longer one gets 400
            (``context_length_exceeded``). Needs ``tokenizer``.
        tokenizer: Called once, on first use, in the serving process: a
            ``tokenizers.Tokenizer`` or the path of a ``tokenizer.json``. It counts
            ``usage`` tokens, enforces ``max_input_tokens``, and turns token-array
            inputs back into text. Without it, usage counts whitespace-separated
            words and token arrays get 400.

    Raises:
        ValueError: ``max_input_tokens`` without a tokenizer, or not >= 1.
    """

    max_input_tokens: int | None = None
    tokenizer: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        if self.max_input_tokens is not None:
            if not isinstance(self.max_input_tokens, int) or self.max_input_tokens < 1:
                given = self.max_input_tokens
                raise ValueError(f"max_input_tokens must be an int >= 1, got {given!r}")
            if self.tokenizer is None:
                raise ValueError("max_input_tokens needs a tokenizer to count tokens")

    @cached_property
    def loaded_tokenizer(self) -> Any:
        """The tokenizer, loaded on first use (None without one)."""
        if self.tokenizer is None:
            return None
        made = self.tokenizer()
        if isinstance(made, str):
            from tokenizers import Tokenizer

            made = Tokenizer.from_file(made)
            made.no_padding()  # count each text's own tokens, all of them
            made.no_truncation()
        return made


class _Request(msgspec.Struct):
    input: str | Annotated[list[Any], msgspec.Meta(max_length=MAX_INPUTS)]
    model: str
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


_decode_request = msgspec.json.Decoder(_Request).decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class _Embedder:
    """One embedding servable: how a text becomes its item, a result its vector."""

    servable: Servable[Any, Any]
    declared: EmbeddingModel
    text_field: str | None

    def item(self, text: str) -> Any:
        if self.text_field is None:
            return text
        return msgspec.convert({self.text_field: text}, self.servable.input_type)


def embedding_routes(host: RouteHost, servables: Mapping[str, Servable[Any, Any]]) -> RouteTable:
    """``/v1/embeddings`` for those of ``servables`` (by name)
    that declare an :class:`EmbeddingModel`; no routes when none does.

    Raises:
        TypeError: A declared embedding model's item type is neither ``str`` nor a
            record with a ``str`` field.
    """
    embedders = {
        name: _embedder(servable, declared)
        for name, servable in servables.items()
        if isinstance(declared := embedding_model_of(servable), EmbeddingModel)
    }
    if not embedders:
        return {}
    return {
        "/v1/embeddings": ("POST", _embeddings(host, embedders), True),
    }


def embedding_model_of(servable: Servable[Any, Any]) -> EmbeddingModel | None:
    """The servable's :class:`EmbeddingModel` declaration, or None."""
    declared = getattr(servable, EMBEDDING_MODEL_ATTRIBUTE, None)
    return declared if isinstance(declared, EmbeddingModel) else None


def _embedder(servable: Servable[Any, Any], declared: EmbeddingModel) -> _Embedder:
    if servable.input_type is str:
        return _Embedder(servable, declared, None)
    fields = record_fields(servable.input_type) or []
    texts = [name for name, hint, _ in fields if hint is str]
    if not texts:
        raise TypeError(
            f"embedding model {servable.name!r}: its item type must be str or a record "
            f"with a str field, not {servable.input_type!r}"
        )
    return _Embedder(servable, declared, texts[0])


def _embeddings(host: RouteHost, embedders: Mapping[str, _Embedder]) -> Handler:
    async def embeddings(scope: Scope, receive: Receive, send: Send) -> int:
        timeout_s, body = await admitted_body(host, scope, receive)
        try:
            request = _parse(body)
            embedder = embedders.get(request.model)
            if embedder is None:
                raise unknown_model(request.model, embedders)
            texts, tokens = _texts(embedder.declared, request.input)
            items = [embedder.item(text) for text in texts]
            deadline = deadline_from(timeout_s)
            results = await until_disconnect(
                scope, receive, submit_all(embedder.servable, items, deadline)
            )
            reply = _reply(request, results, tokens)
        except ClientGone:
            return CLIENT_CLOSED
        except Exception as error:
            return await send_error(send, error, "embeddings")
        await send_response(send, 200, reply, _JSON)
        return 200

    return embeddings


def _parse(body: bytes) -> _Request:
    try:
        request = _decode_request(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise OpenAIError(400, f"Invalid request body: {error}", code="invalid_request") from None
    if request.encoding_format not in ("float", "base64"):
        raise OpenAIError(
            400,
            f"encoding_format must be 'float' or 'base64', not {request.encoding_format!r}",
            param="encoding_format",
        )
    if request.dimensions is not None:
        raise OpenAIError(400, "This model does not support 'dimensions'", param="dimensions")
    return request


def _texts(declared: EmbeddingModel, given: str | list[Any]) -> tuple[list[str], int]:
    """The input texts and their token count (checked against the limit)."""
    tokenizer = declared.loaded_tokenizer
    if isinstance(given, str):
        texts = [given]
    elif not given:
        raise OpenAIError(400, "'input' must not be empty", param="input")
    elif all(isinstance(value, str) for value in given):
        texts = given
    elif all(_is_token(value) for value in given):
        texts = _decoded(tokenizer, [given])
    elif all(isinstance(value, list) and value and all(map(_is_token, value)) for value in given):
        texts = _decoded(tokenizer, given)
    else:
        raise OpenAIError(
            400,
            "'input' must be a string, a list of strings, a list of token ids "
            "or a list of lists of token ids",
            param="input",
        )
    if any(not text for text in texts):
        raise OpenAIError(400, "'input' must not hold an empty string", param="input")
    if tokenizer is None:
        return texts, sum(len(text.split()) for text in texts)
    counts = [len(encoding.ids) for encoding in tokenizer.encode_batch(texts)]
    limit = declared.max_input_tokens
    if limit is not None:
        for index, count in enumerate(counts):
            if count > limit:
                raise OpenAIError(
                    400,
                    f"This model's maximum context length is {limit} tokens; input {index} "
                    f"has {count} tokens",
                    code="context_length_exceeded",
                    param="input",
                )
    return texts, sum(counts)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _decoded(tokenizer: Any, arrays: Sequence[list[int]]) -> list[str]:
    """Token-id arrays back to text, through the model's tokenizer."""
    if tokenizer is None:
        raise OpenAIError(
            400, "This model takes text; token-id inputs need its tokenizer", param="input"
        )
    size = tokenizer.get_vocab_size()
    for index, ids in enumerate(arrays):
        bad = [token for token in ids if not 0 <= token < size]
        if bad:
            raise OpenAIError(
                400,
                f"input {index} has token id {bad[0]}, outside the vocabulary (0..{size - 1})",
                code="invalid_token",
                param="input",
            )
    return [tokenizer.decode(list(ids), skip_special_tokens=True) for ids in arrays]


def _vector(result: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
    if not isinstance(result, (list, tuple, np.ndarray)):
        values = field_values(result).values()
        result = next((v for v in values if isinstance(v, (list, tuple, np.ndarray))), None)
        if result is None:
            raise ValueError("the embedding model's result holds no vector")
    return np.asarray(result, dtype=np.float32)


def _reply(request: _Request, results: list[Any], tokens: int) -> bytes:
    data = []
    for index, result in enumerate(results):
        vector = _vector(result)
        embedding: Any = (
            base64.b64encode(vector.astype("<f4").tobytes()).decode()
            if request.encoding_format == "base64"
            else vector.tolist()
        )
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return _encode(
        {
            "object": "list",
            "data": data,
            "model": request.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
