"""The front of one ``microbatch serve`` process: what its HTTP connections share (the
app, the fast routes, the limits) and the set of open connections, for the
connection cap and the drain."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ..clock import Clock
from ..http.predict import Predictor
from ..http.stream_route import NativeStreamRoute
from .connection import HttpConnection
from .limits import AsgiApp, ConnectionLimits, Record

__all__ = ["ConnectionLimits", "Front"]


class Front:
    """What the connections of one server share: the app, its fast routes, the limits,
    and the open connections (for the cap and the drain).

    Args:
        app: The ASGI app (every route that is not a fast one).
        limits: The connection limits.
        predictors: Fast routes by path (see :meth:`HttpApp.native_predictors`).
        record: Records a finished fast request or stream (route, status, seconds,
            request id, client address).
        clock: Reads the time and sets the connections' timers; by default the
            running loop's (tests pass a :class:`~microbatch.testing.FakeClock`).
        streams: Stream routes by path, answered without ASGI (see
            :meth:`HttpApp.native_streams`).
    """

    def __init__(
        self,
        app: AsgiApp,
        limits: ConnectionLimits,
        predictors: Mapping[str, Predictor] | None = None,
        record: Record | None = None,
        clock: Clock | None = None,
        streams: Mapping[str, NativeStreamRoute] | None = None,
    ) -> None:
        self.app = app
        self.clock = clock
        self.limits = limits
        self.predictors = {path.encode(): p for path, p in (predictors or {}).items()}
        self.streams = {path.encode(): s for path, s in (streams or {}).items()}
        self.record: Record = record if record is not None else _ignore
        self.connections: set[HttpConnection] = set()
        self.closing = False
        self._all_closed: asyncio.Future[None] | None = None

    def __call__(self) -> HttpConnection:
        """A protocol for a new connection (``loop.create_server(front, ...)``)."""
        return HttpConnection(self)

    def shut_down(self) -> None:
        """Take no new request: idle connections close now, busy ones after their
        response."""
        self.closing = True
        for connection in list(self.connections):
            connection.shut_down()

    async def wait_closed(self) -> None:
        """Until every connection is closed."""
        if self.connections:
            self._all_closed = asyncio.get_running_loop().create_future()
            await self._all_closed

    def close_all(self) -> None:
        """Close every connection now (after the graceful timeout)."""
        for connection in list(self.connections):
            connection.abort()

    def forget(self, connection: HttpConnection) -> None:
        """A connection closed."""
        self.connections.discard(connection)
        waiter = self._all_closed
        if not self.connections and waiter is not None and not waiter.done():
            waiter.set_result(None)


def _ignore(route: str, status: int, seconds: float, request_id: str, client: str) -> None:
    pass
