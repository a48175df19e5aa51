"""The ASGI lifespan of an app, run by ``microbatch serve``: startup before the
server listens, shutdown after the last connection closed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..http.asgi import Message

__all__ = ["Lifespan", "LifespanFailed"]


class LifespanFailed(Exception):
    """The app said its startup or shutdown failed (the app logged why)."""


class Lifespan:
    """One app's lifespan: :meth:`startup`, then :meth:`shutdown`.

    Args:
        app: The ASGI app.
    """

    def __init__(self, app: Callable[[Any, Any, Any], Awaitable[None]]) -> None:
        self._app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Start the app's lifespan and wait for its startup.

        Raises:
            LifespanFailed: Its startup failed, or it ended without answering.
        """
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        self._task = asyncio.ensure_future(self._app(scope, self._inbox.get, self._outbox.put))
        await self._inbox.put({"type": "lifespan.startup"})
        await self._expect("lifespan.startup.complete")

    async def shutdown(self) -> None:
        """Ask the app to shut down and wait for it.

        Raises:
            LifespanFailed: Its shutdown failed.
        """
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        try:
            await self._expect("lifespan.shutdown.complete")
        finally:
            await asyncio.wait([self._task])

    async def _expect(self, kind: str) -> None:
        assert self._task is not None
        answer = asyncio.ensure_future(self._outbox.get())
        await asyncio.wait([answer, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():
            answer.cancel()
            error = None if self._task.cancelled() else self._task.exception()
            raise LifespanFailed(f"the app ended during its lifespan: {error!r}")
        message = answer.result()
        if message["type"] != kind:
            raise LifespanFailed(str(message.get("message", message["type"])))
