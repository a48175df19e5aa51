"""gRPC beside the HTTP app in one server: one event loop, one start, one drain.

:class:`WithGrpc` wraps the ASGI app that ``microbatch serve`` runs: after the app's
lifespan has started the services, it starts the gRPC server; on SIGTERM it turns
both readinesses off at once; at shutdown it stops gRPC (finishing the calls in
flight) before the app closes the services.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..http.asgi import Message, Receive, Scope, Send
from ..http.predict import Predictor
from ..http.stream_route import NativeStreamRoute
from .server import GrpcServer

__all__ = ["DrainableApp", "WithGrpc"]


class DrainableApp(Protocol):
    """An ASGI app the server drains (:class:`~microbatch.http.HttpApp`, the
    several-services app)."""

    @property
    def config(self) -> Any:
        """The HTTP settings."""

    @property
    def draining(self) -> bool:
        """Shutdown has begun."""

    def stop_being_ready(self) -> None:
        """Turn readiness off; requests are still served."""

    def begin_draining(self) -> None:
        """Turn readiness off and refuse new items."""

    def native_predictors(self) -> dict[str, Predictor]:
        """The routes a server may answer without ASGI."""

    def native_streams(self) -> dict[str, NativeStreamRoute]:
        """The stream routes a server may answer without ASGI."""

    def record(self, route: str, status: int, seconds: float, request_id: str, client: str) -> None:
        """Count one request answered without ASGI."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""


class WithGrpc:
    """``app``, with ``grpc`` started and stopped inside its lifespan.

    Args:
        app: The HTTP app.
        grpc: The gRPC server of the same models.
        on_listening: Called with the gRPC port once it serves (the CLI prints it).
    """

    def __init__(
        self,
        app: DrainableApp,
        grpc: GrpcServer,
        on_listening: Callable[[int], None] | None = None,
    ) -> None:
        self.app = app
        self.grpc = grpc
        self._on_listening = on_listening

    @property
    def config(self) -> Any:
        """The HTTP app's settings."""
        return self.app.config

    @property
    def draining(self) -> bool:
        """Shutdown has begun."""
        return self.app.draining

    def native_predictors(self) -> dict[str, Predictor]:
        """The HTTP app's: gRPC adds none."""
        return self.app.native_predictors()

    def native_streams(self) -> dict[str, NativeStreamRoute]:
        """The HTTP app's: gRPC adds none."""
        return self.app.native_streams()

    def record(self, route: str, status: int, seconds: float, request_id: str, client: str) -> None:
        """Count one request answered without ASGI in the HTTP app's metrics."""
        self.app.record(route, status, seconds, request_id, client)

    def stop_being_ready(self) -> None:
        """Turn the HTTP readiness off while requests are still served (gRPC's
        readiness follows at the drain)."""
        self.app.stop_being_ready()

    def begin_draining(self) -> None:
        """Turn both readinesses off and refuse new items on both protocols."""
        self.app.begin_draining()
        self.grpc.begin_draining()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point: the app's, with gRPC inside its lifespan."""
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def receive_stopping_grpc() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.grpc.stop()
            return message

        async def send_starting_grpc(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    port = await self.grpc.start()
                except OSError as error:
                    message = {"type": "lifespan.startup.failed", "message": str(error)}
                else:
                    if self._on_listening is not None:
                        self._on_listening(port)
            await send(message)

        await self.app(scope, receive_stopping_grpc, send_starting_grpc)
