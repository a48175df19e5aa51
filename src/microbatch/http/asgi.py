"""The ASGI vocabulary every module of the HTTP layer speaks, and two small helpers.

Only the parts of ASGI 3 that microbatch uses: HTTP requests and the lifespan.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

__all__ = [
    "BODY_DEADLINE_EXTENSION",
    "BODY_WRITER_EXTENSION",
    "DISCONNECT_EXTENSION",
    "Headers",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "extension",
    "header",
    "send_response",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

DISCONNECT_EXTENSION = "microbatch.on_disconnect"
"""Scope extension set by ``microbatch serve``: ``{"register": register}``; after
``register(callback)`` the server calls ``callback()`` once if the client goes away
before the response is complete. Without it, the app watches ``receive()`` in a task
of its own."""

BODY_DEADLINE_EXTENSION = "microbatch.body_deadline"
"""Scope extension set by ``microbatch serve``: the server itself answers 408 and
closes the connection when a body is slower than ``{"timeout_s": ...}``."""

BODY_WRITER_EXTENSION = "microbatch.write_body"
"""Scope extension set by ``microbatch serve``: ``{"write": write}``; once a response
has started (its head and a first part sent with ``more_body``), ``write(body)``
writes one more part at once, from a plain callback, and returns True; or writes
nothing and returns False when the client reads slower than the server writes (or
is gone): ``send`` then waits for it."""


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case) in an HTTP scope, or ``None``."""
    for key, value in scope["headers"]:
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


def extension(scope: Scope, name: str) -> Any:
    """The value of ASGI scope extension ``name``, or ``None`` if the server gave none."""
    extensions = scope.get("extensions")
    return None if extensions is None else extensions.get(name)


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
