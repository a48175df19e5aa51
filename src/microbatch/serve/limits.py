"""What every connection of ``microbatch serve`` keeps to: its limits, its phases, and
what it needs of the server it belongs to (:class:`ConnectionOwner`, which
:class:`~.http_front.Front` is)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..clock import Clock

if TYPE_CHECKING:
    from ..http.predict import Predictor
    from ..http.stream_route import NativeStreamRoute

__all__ = [
    "BODY",
    "CLOSED",
    "HEAD",
    "WAIT",
    "AsgiApp",
    "ConnectionLimits",
    "ConnectionOwner",
    "Record",
]

# phases of a connection
HEAD = 0  # waiting for a request's headers (idle included)
BODY = 1  # reading a request's body
WAIT = 2  # the request is in; its response is not out yet
CLOSED = 3


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits every connection keeps.

    Args:
        header_timeout_s: Longest time from a connection's start (or its previous
            response) until a request's headers are complete; then 408 and close.
        body_timeout_s: Longest time from a request's headers to the end of its body;
            then 408 and close.
        keep_alive_s: An idle connection (no byte of a next request) closes after this.
        max_header_bytes: Most bytes of a request's line and headers; then 431 and close.
        max_connections: Open connections; one more is answered 503 and closed.
        server_timing: Whether the connection's own refusals (400, 408, 431, 503)
            tell ``Server-Timing`` (the error and the time since the request began),
            as the app's responses do.
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_header_bytes: int = 64 * 1024
    max_connections: int = 4096
    server_timing: bool = False


AsgiApp = Callable[[Any, Any, Any], Awaitable[None]]
"""An ASGI application."""

Record = Callable[[str, int, float, str, str], None]
"""Records a finished fast request: route, status, seconds, request id, client address."""


class ConnectionOwner(Protocol):
    """What a connection needs of its server (see :class:`~.http_front.Front`)."""

    app: AsgiApp
    clock: Clock | None
    limits: ConnectionLimits
    record: Record
    closing: bool

    @property
    def predictors(self) -> Mapping[bytes, Predictor]:
        """The fast routes by path."""

    @property
    def streams(self) -> Mapping[bytes, NativeStreamRoute]:
        """The stream routes answered without ASGI, by path."""

    @property
    def connections(self) -> set[Any]:
        """The open connections (a connection adds itself)."""

    def forget(self, connection: Any) -> None:
        """A connection closed."""
