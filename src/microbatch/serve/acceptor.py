"""Accepting connections: every pending one on each wake-up (:class:`Acceptor`).

Under load, uvloop's own server (libuv) drained the listening socket's accept queue
slowly (measured: about 4 connections per 25 ms): 256 clients connecting at once to
a busy server waited there up to 0.8 s, and their first requests with them (the p99
tail at 256 connections, benchmarks/results/http_front.md section 8). The acceptor
takes every pending connection whenever the socket is readable, as asyncio's own
selector loop does, and hands each socket to the loop as a transport.
"""

from __future__ import annotations

import _socket
import asyncio
import errno
import logging
import socket
from collections.abc import Callable

from mypy_extensions import mypyc_attr

__all__ = ["AcceptedSocket", "Acceptor"]

logger = logging.getLogger("microbatch.serve")

# Out of file descriptors (or kernel buffers): stop accepting for a while rather
# than wake on the still-readable socket in a loop.
_RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
RETRY_AFTER_S = 1.0


@mypyc_attr(native_class=False)  # it extends an interpreted class
class AcceptedSocket(socket.socket):
    """An accepted connection's socket, whose ``family`` and ``type`` read as plain
    ints: ``socket.socket``'s convert them to enums on every read, and uvloop reads
    both for every connection it is handed."""

    __slots__ = ()
    family = _socket.socket.family  # type: ignore[assignment]
    type = _socket.socket.type  # type: ignore[assignment]


class Acceptor:
    """Accepts the connections of a listening socket for a protocol factory.

    Args:
        sock: A bound socket, already listening.
        protocol_factory: Makes the protocol of each accepted connection.
        loop: The running loop (its ``connect_accepted_socket`` makes the transports).
    """

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._sock = sock
        self._factory = protocol_factory
        self._loop = loop
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Each accepted socket is made with the listening one's family and type as
        # known here: socket.accept() converts both to enums for every connection.
        self._kind = (sock.family, sock.type, sock.proto)
        self._tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self.accept_pending)

    def accept_pending(self) -> None:
        """Accept every connection waiting in the socket's accept queue."""
        while not self._closed:
            try:
                fd, _ = self._sock._accept()  # type: ignore[attr-defined]  # (see _kind)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in _RESOURCE_ERRORS:
                    logger.warning("not accepting for %.0f s: %s", RETRY_AFTER_S, error)
                    self._loop.remove_reader(self._sock.fileno())
                    self._loop.call_later(RETRY_AFTER_S, self._resume)
                    return
                if error.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue  # the client left before we took it
                raise
            self._start(AcceptedSocket(*self._kind, fileno=fd))

    def _start(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        if self._tcp:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = self._loop.create_task(self._connect(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:
            conn.close()  # the client reset the connection before it started

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self.accept_pending)

    def close(self) -> None:
        """Stop listening (connections already accepted go on)."""
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
