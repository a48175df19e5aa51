"""Helpers for in-process HTTP tests: run the ASGI lifespan, talk through httpx."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from microbatch.http import HttpApp
from microbatch.serve.http_front import ConnectionLimits, Front


@contextlib.asynccontextmanager
async def lifespan(app: HttpApp) -> AsyncIterator[None]:
    """Run ``app``'s ASGI lifespan: startup on entry, shutdown on exit."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def send(message: Any) -> None:
        await outbox.put(dict(message))

    task = asyncio.get_running_loop().create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)
    )
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await task


@contextlib.asynccontextmanager
async def serving(app: HttpApp) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to ``app`` in-process, inside its lifespan."""
    async with lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@contextlib.asynccontextmanager
async def serving_natively(app: HttpApp) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to ``app`` over 127.0.0.1 through ``microbatch
    serve``'s own connection layer (its routes without ASGI too), in this process,
    inside the app's lifespan."""
    async with lifespan(app):
        front = Front(
            app,
            ConnectionLimits(),
            app.native_predictors(),
            app.record,
            streams=app.native_streams(),
        )
        server = await asyncio.get_running_loop().create_server(front, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                yield client
        finally:
            server.close()
            front.close_all()
            await server.wait_closed()


def http_scope(
    path: str = "/predict", method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, Any]:
    """A minimal ASGI HTTP scope, for tests that drive the app message by message."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers or [(b"content-type", b"application/json")],
    }


class Recorder:
    """An ASGI ``send`` that keeps every message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: Any) -> None:
        self.messages.append(dict(message))

    @property
    def status(self) -> int | None:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None
