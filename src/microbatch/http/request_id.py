"""The request id: taken from the client's ``X-Request-ID`` when it is safe to echo
and to log, else made here; sent back on every response and put on every log line
written while the request is served."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable

from .asgi import Message, Send

__all__ = ["MAX_REQUEST_ID_CHARS", "REQUEST_ID_HEADER", "RequestIds", "echo_request_id"]

REQUEST_ID_HEADER = b"x-request-id"
"""The header a client names its request with; every response carries it back."""

MAX_REQUEST_ID_CHARS = 128
"""A longer id from a client is replaced by one made here."""

# Letters, digits and a few marks that need no quoting in a header, a log line or JSON.
_SAFE = re.compile(rb"[A-Za-z0-9._:+=@/-]{1,%d}" % MAX_REQUEST_ID_CHARS)


class RequestIds:
    """Request ids: the client's when valid, else this process's random prefix and a
    counter (unique without a random draw per request)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(6).hex() + "-"
        self._made = 0

    def for_request(self, given: bytes | None) -> str:
        """The client's id if it is 1 to 128 safe characters, else a new one."""
        if given is not None and _SAFE.fullmatch(given):
            return given.decode("ascii")
        self._made += 1
        return self._prefix + str(self._made)  # str(): compiled, cheaper than a format


def echo_request_id(send: Send, request_id: str) -> Send:
    """``send`` that adds ``X-Request-ID: request_id`` to the response's headers."""
    value = request_id.encode("ascii")

    # A plain function handing back send's awaitable: no coroutine of its own per call.
    def send_with_id(message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), (REQUEST_ID_HEADER, value)]
        return send(message)

    return send_with_id
