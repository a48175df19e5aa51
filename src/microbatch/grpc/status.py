"""What went wrong, as a gRPC status code and a short message.

The message is the one the HTTP layer sends (:func:`microbatch.http.status.error_reply`:
never a traceback, never a model's own message); the code follows from the error.
"""

from __future__ import annotations

import grpc

from ..errors import Overloaded
from ..http.status import error_reply

__all__ = ["grpc_status"]

_BY_HTTP_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message of ``error``: overload is ``RESOURCE_EXHAUSTED``,
    a passed deadline ``DEADLINE_EXCEEDED``, bad input ``INVALID_ARGUMENT``, not
    ready or shutting down ``UNAVAILABLE``, a model's error ``INTERNAL``."""
    reply = error_reply(error)
    if isinstance(error, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, reply.message
    code = _BY_HTTP_STATUS.get(reply.status)
    if code is None:
        code = grpc.StatusCode.INVALID_ARGUMENT if reply.status < 500 else grpc.StatusCode.INTERNAL
    return code, reply.message
