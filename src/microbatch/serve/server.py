"""The HTTP server of ``microbatch serve``: the ASGI app under uvicorn (uvloop, httptools).

On top of uvicorn: an absolute deadline and a size cap on reading request headers
(against slow or endless headers), a socket bound before serving so that port 0
works, the bound URL printed once the service is ready, and SIGTERM/SIGINT turning
readiness to 503 at once before uvicorn's graceful shutdown, with exit status 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import signal
import socket
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from ..http.app import HttpApp
from ..http.asgi import BODY_DEADLINE_EXTENSION, DISCONNECT_EXTENSION
from .drain import ShutdownSequence

__all__ = ["HeaderGuardedProtocol", "ServeSettings", "bind", "listen_url", "serve"]


_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-length: 0\r\nconnection: close\r\n\r\n"
)

_JOIN_LIMIT = 64 * 1024  # smaller bodies are copied behind the head; larger go as a list


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
        max_connections: Connections plus running requests; beyond it uvicorn answers 503.
        log_level: ``debug``, ``info``, ``warning`` or ``error``.
        log_format: ``text`` or ``json`` (see :mod:`microbatch.logs`).
        drain_delay_s: On SIGTERM, readiness answers 503 at once and requests are
            still served for this long before the graceful shutdown begins.
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


class HeaderGuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read deadlines, a header size cap, and a
    disconnect hook for the app.

    uvicorn alone has no read deadline: its keep-alive timer stops at the first
    byte, so a client sending a request one byte at a time holds a connection for as
    long as it likes (slowloris). Here one timer covers each request: its headers must
    be complete ``header_timeout_s`` after the connection opened (or the previous
    response went out), and its body ``body_timeout_s`` after the headers; then 408
    and close.

    Each request's scope carries two ASGI extensions (see :mod:`.asgi`): the body
    deadline is enforced here (so the app needs no timer of its own), and the app
    may register a callback that runs if the client disconnects before the response
    is complete (so it needs no task watching ``receive()``).
    """

    header_timeout_s = 10.0
    body_timeout_s = 30.0
    max_header_bytes = 64 * 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_bytes = 0
        self._read_timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf  # when the armed timer fires
        self._due = math.inf  # the current read deadline (none while the app answers)
        self._reading_headers = False
        self._on_disconnect: Callable[[], None] | None = None
        self._extensions: dict[str, dict[object, object]] = {
            DISCONNECT_EXTENSION: {"register": self._register_disconnect},
            BODY_DEADLINE_EXTENSION: {"timeout_s": self.body_timeout_s},
        }
        self._in_body = False  # bytes that arrive now are a body's, not headers
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        """Refuse headers that grow past the cap before the parser sees them (the
        bytes up to the blank line that ends them count); feed the parser."""
        if self._reading_headers and not self._in_body:
            end = data.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else end + 4
            if self._header_bytes > self.max_header_bytes:
                self._refuse(_HEADERS_TOO_LARGE)
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        """A new request: its scope gets the extensions."""
        super().on_message_begin()
        self.scope["extensions"] = self._extensions

    def on_headers_complete(self) -> None:
        """The headers are in: the body's deadline starts, and the request runs."""
        self._reading_headers = False
        self._in_body = True
        self._read_by(self.loop.time() + self.body_timeout_s)
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = _OneWriteResponses(self.transport, self.cycle)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        """The whole request is in (also one whose response went out before its body
        was read): no read deadline until the response is out."""
        self._due = math.inf
        self._in_body = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """A response went out: the next request's headers get a fresh deadline."""
        self._on_disconnect = None
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the timer with the connection; tell the app if a response was due."""
        self._stop_read_timer()
        callback, self._on_disconnect = self._on_disconnect, None
        self._extensions.clear()  # they refer back to this protocol: no cycle left
        super().connection_lost(exc)
        if callback is not None:
            callback()

    def _register_disconnect(self, callback: Callable[[], None]) -> None:
        self._on_disconnect = callback

    def _await_headers(self) -> None:
        self._header_bytes = 0
        self._reading_headers = True
        self._read_by(self.loop.time() + self.header_timeout_s)

    def _read_by(self, due: float) -> None:
        """Set the read deadline. One timer per connection serves every request: it
        is moved only to an earlier time; when it fires before the deadline (which
        moved later meanwhile), it is armed again for it. So a request costs no timer
        of its own."""
        self._due = due
        if due < self._timer_at:
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._timer_at = due
            self._read_timer = self.loop.call_at(due, self._read_too_slow)

    def _stop_read_timer(self) -> None:
        self._reading_headers = False
        self._due = math.inf
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
            self._timer_at = math.inf

    def _read_too_slow(self) -> None:
        self._read_timer = None
        self._timer_at = math.inf
        due = self._due
        if due == math.inf:
            return  # the app is answering: no read deadline now
        if self.loop.time() < due:  # the deadline moved since the timer was armed
            self._timer_at = due
            self._read_timer = self.loop.call_at(due, self._read_too_slow)
            return
        if self._in_body and (self.cycle is None or self.cycle.response_started):
            return  # the app answered before reading the whole body: not a slow read
        self._refuse(_REQUEST_TIMEOUT)

    def _refuse(self, response: bytes) -> None:
        self._stop_read_timer()
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()


class _OneWriteResponses:
    """A request's view of its connection that sends a response's head together with
    its first body part.

    uvicorn writes the status line and headers, then the body, as two writes: two
    ``send()`` calls and two packets for every small response. Holding the head back
    until the body comes makes it one of each, which is most of the server's cost per
    request after parsing.
    """

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: RequestResponseCycle) -> None:
        self._transport = transport
        # Weak: the cycle holds this object as its transport, and a strong reference
        # back would leave every request as garbage for the cyclic collector (whose
        # full passes then paused the server for tens of milliseconds under load).
        self._cycle = weakref.ref(cycle)
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        """Hold the response's head; send it with the next write."""
        head = self._head
        if head is not None:
            self._head = None
            if len(data) < _JOIN_LIMIT:
                self._transport.write(head + data)
            else:
                self._transport.writelines((head, data))
        elif (
            (cycle := self._cycle()) is not None
            and cycle.response_started
            and not cycle.response_complete
            and data.startswith(b"HTTP/")
        ):
            self._head = data
        else:
            self._transport.write(data)

    def close(self) -> None:
        """Send what is held, then close."""
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def is_closing(self) -> bool:
        """Whether the connection is closing."""
        return self._transport.is_closing()


class _Server(uvicorn.Server):
    """uvicorn's server: signals begin draining, the bound URL is printed when ready."""

    def __init__(
        self, config: uvicorn.Config, app: HttpApp, url: str | None, drain_delay_s: float
    ) -> None:
        super().__init__(config)
        self.app = app
        self.url = url
        self.drain_delay_s = drain_delay_s

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Handle SIGTERM/SIGINT in the event loop, and do not re-raise them on exit
        (uvicorn does, which would end the process with the signal, not status 0)."""
        loop = asyncio.get_running_loop()
        self._shutdown = ShutdownSequence(self.app, self.drain_delay_s, self._exit, loop.call_later)
        signals = (signal.SIGTERM, signal.SIGINT)
        for number in signals:
            loop.add_signal_handler(number, self._on_signal, number)
        try:
            yield
        finally:
            for number in signals:
                loop.remove_signal_handler(number)

    def _on_signal(self, number: int) -> None:
        if self.should_exit and number == signal.SIGINT:
            self.force_exit = True
        self._shutdown.signalled()

    def _exit(self) -> None:
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start the service and listen; then print the URL (on one line, flushed)."""
        await super().startup(sockets)
        if self.started:
            quiet_garbage_collector()
            if self.url is not None:
                print(f"microbatch serving on {self.url}", flush=True)


# The collector's youngest generation is collected after this many more container
# objects were made than freed (Python's default: 700).
GC_YOUNG_THRESHOLD = 7000


def quiet_garbage_collector() -> None:
    """Tune the collector of a process that is ready to serve.

    What is alive now (modules, the app, the model's code) lives as long as the
    server: ``gc.freeze()`` takes it out of the collector's passes. A request's
    objects are freed by reference counting; the collector only looks for reference
    cycles, so its youngest generation is collected 10x less often. With Python's
    defaults the passes took about 12% of the serving process's CPU under load, and
    each full pass over the startup objects paused it for about 20 ms.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


def serve(
    app: HttpApp, settings: ServeSettings, sock: socket.socket | None = None, announce: bool = True
) -> int:
    """Serve ``app`` until SIGTERM or SIGINT; return the exit status (0 after a drain).

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
    protocol = type(
        "ConfiguredHeaderGuardedProtocol",
        (HeaderGuardedProtocol,),
        {
            "header_timeout_s": settings.header_timeout_s,
            "body_timeout_s": app.config.body_timeout_s,
            "max_header_bytes": settings.max_header_bytes,
        },
    )
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http=protocol,
        lifespan="on",
        log_level=settings.log_level,
        access_log=False,  # the app logs each request (--access-log)
        log_config=None,  # one format for every logger: microbatch.logs
        timeout_keep_alive=int(max(1, settings.keep_alive_s)),
        timeout_graceful_shutdown=int(max(1, settings.graceful_timeout_s)),
        limit_concurrency=settings.max_connections,
        proxy_headers=False,  # bound to loopback by default: no proxy to trust
        server_header=False,
    )
    url = listen_url(settings.host, sock) if announce else None
    server = _Server(config, app, url, settings.drain_delay_s)
    with sock:
        server.run(sockets=[sock])
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
