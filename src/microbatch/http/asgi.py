"""The ASGI vocabulary every module of the HTTP layer speaks, and two small helpers.

Only the parts of ASGI 3 that microbatch uses: HTTP requests and the lifespan.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

__all__ = ["Headers", "Message", "Receive", "Scope", "Send", "header", "send_response"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case) in an HTTP scope, or ``None``."""
    for key, value in scope["headers"]:
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Send a whole response: status line, headers and one body message."""
    headers: Headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *extra_headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
