"""Every OpenAI-compatible route of an app: ``/v1/embeddings`` for the embedding
models (:mod:`.openai`), ``/v1/completions`` and ``/v1/chat/completions`` for the
text generators (:mod:`.completions`), and ``GET /v1/models`` listing them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ..types import Servable
from .asgi import Receive, Scope, Send, send_response
from .completions import COMPLETION_MODEL_ATTRIBUTE, completion_model_names, completion_routes
from .openai import EMBEDDING_MODEL_ATTRIBUTE, embedding_model_of, embedding_routes
from .routing import Handler, RouteHost, RouteTable

__all__ = ["OPENAI_DECLARATIONS", "openai_declarations", "openai_routes"]

OPENAI_DECLARATIONS = (EMBEDDING_MODEL_ATTRIBUTE, COMPLETION_MODEL_ATTRIBUTE)
"""The attributes by which a servable declares its OpenAI routes: what a copy of a
service built elsewhere (a Ray replica) must carry over."""


def openai_declarations(servable: object) -> tuple[tuple[str, object], ...]:
    """The (attribute, value) pairs of :data:`OPENAI_DECLARATIONS` that ``servable``
    sets."""
    return tuple(
        (name, getattr(servable, name))
        for name in OPENAI_DECLARATIONS
        if getattr(servable, name, None) is not None
    )


def openai_routes(host: RouteHost, servables: Mapping[str, Servable[Any, Any]]) -> RouteTable:
    """The OpenAI routes for ``servables`` (by name); none when no servable declares
    itself an embedding model or a text generator.

    Raises:
        TypeError: A declaration does not fit its servable (see
            :func:`.embedding_routes` and :func:`.completion_routes`).
        ValueError: Two text generators have the same name.
    """
    routes = {**embedding_routes(host, servables), **completion_routes(host, servables)}
    if not routes:
        return {}
    names = [name for name, servable in servables.items() if embedding_model_of(servable)]
    names += completion_model_names(servables)
    routes["/v1/models"] = ("GET", _models(list(dict.fromkeys(names))), True)
    return routes


def _models(names: list[str]) -> Handler:
    """``GET /v1/models``: ``names``, OpenAI's way."""
    listing = msgspec.json.encode(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "microbatch"}
                for name in names
            ],
        }
    )

    async def models(scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, listing, b"application/json")
        return 200

    return models
