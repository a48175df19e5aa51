"""The one mapping from what went wrong to an HTTP status, headers and error body.

microbatch's own errors carry their status (``http_status``); the HTTP layer's
errors are defined here with theirs. Bodies name the error and say what happened in
a short message; they never carry a traceback or a model's own message (those go to
the log under the request id that the body carries).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from ..errors import MicrobatchError, RemoteError
from .codecs import NotAcceptable, UnsupportedMediaType

__all__ = [
    "RETRY_AFTER_S",
    "BadRequest",
    "BodyTooLarge",
    "BodyTooSlow",
    "ErrorBody",
    "ErrorReply",
    "HttpError",
    "MethodNotAllowed",
    "NotFound",
    "NotReady",
    "Unauthorized",
    "UnencodableResult",
    "error_reply",
]

RETRY_AFTER_S = 1
"""What a 503 answer tells clients to wait before they try again (``Retry-After``)."""


class HttpError(Exception):
    """An error of the HTTP exchange itself; ``http_status`` is its status."""

    http_status = 400


class BadRequest(HttpError):
    """The body is not valid JSON or msgpack, or a header has a bad value."""

    http_status = 400


class Unauthorized(HttpError):
    """A bearer token is required and was missing or wrong."""

    http_status = 401


class NotFound(HttpError):
    """No such route."""

    http_status = 404


class MethodNotAllowed(HttpError):
    """The route exists but not for this method; ``allow`` names the one it takes."""

    http_status = 405

    def __init__(self, message: str, allow: str) -> None:
        super().__init__(message)
        self.allow = allow


class BodyTooSlow(HttpError):
    """The body did not arrive within the body read timeout."""

    http_status = 408


class BodyTooLarge(HttpError):
    """The body is larger than ``max_body_bytes``."""

    http_status = 413


class UnencodableResult(HttpError):
    """The model returned a result that JSON or msgpack cannot carry."""

    http_status = 500


class NotReady(HttpError):
    """The service is starting, draining or has no live worker in some stage."""

    http_status = 503


@dataclass(frozen=True)
class ErrorReply:
    """What an error becomes on the wire."""

    status: int
    error: str
    message: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class ErrorBody(msgspec.Struct):
    """The body of every error response."""

    error: str
    message: str
    request_id: str | None = None


_FIXED_STATUS: dict[type[Exception], int] = {
    msgspec.ValidationError: 422,
    msgspec.DecodeError: 400,
    UnsupportedMediaType: 415,
    NotAcceptable: 406,
}


def error_reply(error: BaseException) -> ErrorReply:
    """Map an exception to its status, error name, short message and headers.

    Errors that are not microbatch's own or the HTTP layer's are the model's: 500
    with the exception's type name only.
    """
    status = _status_of(error)
    name = type(error).__name__
    if isinstance(error, RemoteError):
        name, message = "ModelError", f"the model raised {error.type_name}"
    elif isinstance(error, (MicrobatchError, HttpError, *_FIXED_STATUS)):
        message = str(error)
        if isinstance(error, msgspec.ValidationError):
            name = "ValidationError"
        elif isinstance(error, msgspec.DecodeError):
            name = "MalformedBody"
    else:
        name, message = "ModelError", f"the model raised {type(error).__name__}"
    headers = []
    if status == 503:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    elif status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    elif isinstance(error, MethodNotAllowed):
        headers.append((b"allow", error.allow.encode()))
    return ErrorReply(status, name, message, headers)


def _status_of(error: BaseException) -> int:
    if isinstance(error, (MicrobatchError, HttpError)):
        return error.http_status
    for kind, status in _FIXED_STATUS.items():
        if isinstance(error, kind):
            return status
    return 500
