"""Errors OpenAI's way, for every OpenAI-compatible route:
``{"error": {"message", "type", "param", "code"}}`` with the status of
:mod:`microbatch.http.status` (or the one an :class:`OpenAIError` carries), so that
the official client raises its own exceptions (``NotFoundError``, ``APIError``...).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import msgspec

from .asgi import Send, send_response
from .server_timing import note_error
from .status import error_reply

__all__ = [
    "MAX_INPUTS",
    "OpenAIError",
    "error_body",
    "error_shape",
    "param_of",
    "send_error",
    "unknown_model",
]

MAX_INPUTS = 2048
"""The most inputs one OpenAI request may carry (texts to embed; choices of a
completion, prompts times ``n``), as OpenAI's API allows: one request cannot take
the whole service's queue (a larger one is 400)."""

logger = logging.getLogger("microbatch.http")

_JSON = b"application/json"
_encode = msgspec.json.Encoder().encode
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error"}


class OpenAIError(Exception):
    """An error OpenAI's way: its status, type, code and parameter."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.http_status = status
        self.message = message
        self.code = code
        self.param = param


def unknown_model(asked: str, known: Iterable[str]) -> OpenAIError:
    """The 404 for a request whose ``model`` is none of ``known``."""
    return OpenAIError(
        404,
        f"The model '{asked}' does not exist; this server has {sorted(known)}",
        code="model_not_found",
        param="model",
    )


def error_body(error: BaseException, route: str) -> tuple[int, dict[str, Any], list[Any]]:
    """The status, OpenAI-shaped body and headers that answer ``error`` (an
    unexpected one is logged as a failure of ``route``)."""
    if isinstance(error, OpenAIError):
        status, message, code, param = error.http_status, error.message, error.code, error.param
        headers: list[tuple[bytes, bytes]] = []
    else:
        reply = error_reply(error)
        status, message, code, param = reply.status, reply.message, reply.error, None
        headers = reply.headers
        if status >= 500 and status not in (503, 504):
            logger.error("%s failed: %s", route, message, exc_info=error)
    return status, error_shape(status, message, code, param), headers


def error_shape(
    status: int, message: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object for an error of ``status``."""
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def send_error(send: Send, error: BaseException, route: str) -> int:
    """Send the answer to ``error`` in OpenAI's shape (see :func:`error_body`);
    return its status."""
    status, body, headers = error_body(error, route)
    note_error(body["error"]["code"] or body["error"]["type"])  # its Server-Timing names it
    await send_response(send, status, _encode(body), _JSON, headers)
    return status


def param_of(message: str) -> str | None:
    """The request field a msgspec validation message names (``... - at `$.max_tokens```
    gives ``max_tokens``; ``$.stop[4]`` gives ``stop``), or None."""
    _, at, path = message.rpartition("- at `$.")
    if not at:
        return None
    name = path.rstrip("`")
    for mark in (".", "["):
        name = name.split(mark, 1)[0]
    return name or None
