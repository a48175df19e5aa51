"""The HTTP server of ``microbatch serve``: the app on microbatch's own HTTP/1.1
connection layer (:mod:`.connection`, on uvloop and httptools).

The server binds its socket before serving (so that port 0 works), runs the app's
ASGI lifespan, prints the bound URL once the service is ready, and on SIGTERM/SIGINT
turns readiness to 503 at once, stops accepting, lets every accepted request finish
(up to the graceful timeout), closes the service and exits with status 0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from dataclasses import dataclass
from typing import Any, Protocol

import uvloop

from ..http.asgi import Receive, Scope, Send
from ..http.predict import Predictor
from ..http.stream_route import NativeStreamRoute
from ..pipeline.worker_env import share_serving_cores
from .acceptor import Acceptor
from .drain import ShutdownSequence
from .http_front import ConnectionLimits, Front
from .lifespan import Lifespan, LifespanFailed
from .switch_interval import switch_interval

__all__ = ["ServeSettings", "ServedApp", "bind", "listen_url", "serve"]

logger = logging.getLogger("microbatch.serve")

STARTUP_FAILED = 3
"""The exit status when the service cannot start."""


@dataclass(frozen=True)
class ServeSettings:
    """How the server listens and shuts down.

    Args:
        host: Address to bind (loopback unless told otherwise).
        port: Port to bind; 0 picks a free one (the printed URL names it).
        graceful_timeout_s: On SIGTERM, longest wait for in-flight requests.
        header_timeout_s: Longest time from a connection's start (or its previous
            response) until a request's headers are complete; then 408 and close.
        max_header_bytes: Most bytes of request headers; then 431 and close.
        keep_alive_s: Idle keep-alive connections are closed after this long.
        max_connections: Open connections; one more is answered 503 and closed.
        log_level: ``debug``, ``info``, ``warning`` or ``error``.
        log_format: ``text`` or ``json`` (see :mod:`microbatch.logs`).
        drain_delay_s: On SIGTERM, readiness answers 503 at once and requests are
            still served for this long before the graceful shutdown begins.
        switch_interval_s: The interpreter's switch interval while serving (None:
            Python's own; see :mod:`.switch_interval`).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    graceful_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    keep_alive_s: float = 5.0
    max_connections: int = 4096
    log_level: str = "info"
    log_format: str = "text"
    drain_delay_s: float = 0.0
    switch_interval_s: float | None = None


class ServedApp(Protocol):
    """What :func:`serve` runs: an ASGI app that drains, and the predict routes it lets
    the connection layer call without ASGI (:class:`~microbatch.http.HttpApp`, the
    several-services app, either with gRPC beside it)."""

    @property
    def config(self) -> Any:
        """The HTTP settings (``body_timeout_s`` is read here)."""

    def stop_being_ready(self) -> None:
        """Turn readiness off; requests are still served (the drain delay)."""

    def begin_draining(self) -> None:
        """Turn readiness off and refuse new items."""

    def native_predictors(self) -> dict[str, Predictor]:
        """The routes answered without ASGI, by path (may be empty)."""

    def native_streams(self) -> dict[str, NativeStreamRoute]:
        """The stream routes answered without ASGI, by path (may be empty)."""

    def record(self, route: str, status: int, seconds: float, request_id: str, client: str) -> None:
        """Count (and access-log) one request answered without ASGI."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""


# The collector's youngest generation is collected after this many more container
# objects were made than freed: Python's default.
GC_YOUNG_THRESHOLD = 700


def ready_to_serve() -> None:
    """Tune a process that is ready to serve (its service started): its garbage
    collector, and its math libraries' threads (a thread stage's model, a ``@batch``
    function: the usable cores less one, the event loop's, unless the environment
    sets a thread count; ``pipeline/worker_env.py``)."""
    quiet_garbage_collector()
    share_serving_cores()


def quiet_garbage_collector() -> None:
    """Tune the collector of a process that is ready to serve.

    What is alive now (modules, the app, the model's code) lives as long as the
    server: ``gc.freeze()`` takes it out of the collector's passes, so a full pass no
    longer pauses the server for tens of milliseconds. The youngest generation keeps
    Python's default threshold: the connection layer makes little cyclic garbage per
    request (no ASGI cycle objects on the hot path), and with a 10x higher threshold
    the full passes came so rarely that dead worker processes (objects in cycles,
    holding pipe descriptors) piled up: the soak's descriptor count grew 6%.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


def serve(
    app: ServedApp,
    settings: ServeSettings,
    sock: socket.socket | None = None,
    announce: bool = True,
) -> int:
    """Serve ``app`` until SIGTERM or SIGINT; return the exit status (0 after a drain,
    :data:`STARTUP_FAILED` if the service could not start).

    Args:
        app: The app.
        settings: Where to listen and how to shut down.
        sock: A bound socket to serve on instead of binding ``settings``' address.
        announce: Print ``microbatch serving on URL`` once ready.

    Raises:
        OSError: The address cannot be bound.
    """
    if sock is None:
        sock = bind(settings.host, settings.port)
    with sock, switch_interval(settings.switch_interval_s):
        return uvloop.run(_serve(app, settings, sock, announce))


def limits_of(app: ServedApp, settings: ServeSettings) -> ConnectionLimits:
    """The connection limits ``settings`` and the app's body timeout give."""
    return ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=app.config.body_timeout_s,
        keep_alive_s=settings.keep_alive_s,
        max_header_bytes=settings.max_header_bytes,
        max_connections=settings.max_connections,
        server_timing=app.config.server_timing,
    )


async def _serve(
    app: ServedApp, settings: ServeSettings, sock: socket.socket, announce: bool
) -> int:
    loop = asyncio.get_running_loop()
    lifespan = Lifespan(app)
    try:
        await lifespan.startup()
    except LifespanFailed as error:
        logger.error("the service did not start: %s", error)
        return STARTUP_FAILED
    front = Front(
        app,
        limits_of(app, settings),
        app.native_predictors(),
        app.record,
        streams=app.native_streams(),
    )
    stop = loop.create_future()
    signals = (signal.SIGTERM, signal.SIGINT)

    def stop_serving() -> None:
        if not stop.done():
            stop.set_result(None)

    shutdown = ShutdownSequence(app, settings.drain_delay_s, stop_serving, loop.call_later)

    def on_signal(number: int) -> None:
        if not stop.done():
            shutdown.signalled()  # readiness 503; the drain after the delay (or now)
        elif number == signal.SIGINT:
            front.close_all()  # a second Ctrl-C while draining: stop waiting

    for number in signals:
        loop.add_signal_handler(number, on_signal, number)
    try:
        sock.listen(2048)
        acceptor = Acceptor(sock, front, loop)
        ready_to_serve()
        if announce:
            print(f"microbatch serving on {listen_url(settings.host, sock)}", flush=True)
        await stop
        logger.info(
            "draining: %d connections open, up to %.0f s to finish",
            len(front.connections),
            settings.graceful_timeout_s,
        )
        acceptor.close()
        front.shut_down()
        try:
            await asyncio.wait_for(front.wait_closed(), settings.graceful_timeout_s)
        except asyncio.TimeoutError:
            logger.warning(
                "%d connections still open after the graceful timeout", len(front.connections)
            )
            front.close_all()
    finally:
        for number in signals:
            loop.remove_signal_handler(number)
    try:
        await lifespan.shutdown()
    except LifespanFailed as error:
        logger.error("the service did not close cleanly: %s", error)
        return 1
    return 0


def listen_url(host: str, sock: socket.socket) -> str:
    """The URL a socket bound for ``host`` serves on (its real port, if 0 was asked)."""
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port), not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
