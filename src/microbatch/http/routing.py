"""What protocol route sets (v2, OpenAI) need from the app that mounts them, and the
wait for a request's results that a client's disconnect cancels.

Route sets depend on :class:`RouteHost` (a structural type), never on the app
module itself: the app imports them to fill its route table.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from .asgi import DISCONNECT_EXTENSION, Receive, Scope, Send, extension
from .status import NotReady

__all__ = [
    "CLIENT_CLOSED",
    "ClientGone",
    "Handler",
    "RouteHost",
    "RouteTable",
    "admitted_body",
    "until_disconnect",
]

T = TypeVar("T")

Handler = Callable[[Scope, Receive, Send], Awaitable[int]]
"""A route's handler: it sends the whole response and returns its status."""

RouteTable = dict[str, tuple[str, Handler, bool]]
"""Path to (method, handler, protected by the bearer token)."""

CLIENT_CLOSED = 499
"""The status recorded (in metrics only) when the client left before its answer."""


class ClientGone(Exception):
    """The client disconnected while its request waited; its items were cancelled."""


class RouteHost(Protocol):
    """The parts of the HTTP app a protocol's routes use: limits, deadline header,
    drain state (see :class:`~microbatch.http.HttpApp`)."""

    @property
    def draining(self) -> bool:
        """Shutdown has begun."""

    def timeout_s(self, scope: Scope) -> float:
        """The request's timeout: the default, lowered by ``X-Request-Timeout-Ms``."""

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, under the size and time limits."""


async def admitted_body(host: RouteHost, scope: Scope, receive: Receive) -> tuple[float, bytes]:
    """A protocol request's timeout and whole body, once the host is not draining.

    Raises:
        NotReady: Shutdown has begun (503).
    """
    if host.draining:
        raise NotReady("the server is shutting down")
    timeout_s = host.timeout_s(scope)
    return timeout_s, await host.read_body(scope, receive)


async def until_disconnect(scope: Scope, receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work``; cancel it if the client disconnects first.

    Raises:
        ClientGone: The client disconnected (``work`` was cancelled).
    """
    disconnect = extension(scope, DISCONNECT_EXTENSION)
    loop = asyncio.get_running_loop()
    if disconnect is None:
        task = loop.create_task(work)
        watcher = loop.create_task(_cancel_on_disconnect(receive, task))
        try:
            return await task
        except asyncio.CancelledError:
            if watcher.done() and not watcher.cancelled():
                raise ClientGone from None
            raise
        finally:
            watcher.cancel()
    current = asyncio.current_task()
    assert current is not None
    waiting, gone = True, False

    def cancel() -> None:
        nonlocal gone
        if waiting:
            gone = True
            current.cancel()

    disconnect["register"](cancel)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        if sys.version_info >= (3, 11):
            current.uncancel()
        raise ClientGone from None
    finally:
        waiting = False


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any]) -> None:
    if (await receive())["type"] == "http.disconnect":
        task.cancel()
