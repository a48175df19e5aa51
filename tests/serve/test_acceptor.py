"""The acceptor drains the accept queue on each wake-up (see
:mod:`microbatch.serve.acceptor`); every accepted socket gets its own protocol.

Timeouts here are hang guards, never pass criteria.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from unittest import mock

import pytest
import uvloop

from microbatch.serve.acceptor import AcceptedSocket, Acceptor

HANG_GUARD_S = 10.0
CLIENTS = 40


class _Echo(asyncio.Protocol):
    """Counts itself in, answers each read with the same bytes."""

    def __init__(self, made: list[_Echo], all_made: asyncio.Event, count: int) -> None:
        self._made, self._all_made, self._count = made, all_made, count
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._made.append(self)
        if len(self._made) == self._count:
            self._all_made.set()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


def _listening() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    return sock


async def _every_pending_connection_in_one_call() -> None:
    loop = asyncio.get_running_loop()
    sock = _listening()
    port = sock.getsockname()[1]
    made: list[_Echo] = []
    all_made = asyncio.Event()
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(CLIENTS)]
    try:
        acceptor = Acceptor(sock, lambda: _Echo(made, all_made, CLIENTS), loop)
        acceptor.accept_pending()  # one wake-up, before the loop runs again
        with pytest.raises(BlockingIOError):
            sock.accept()  # nothing was left in the accept queue
        await asyncio.wait_for(all_made.wait(), HANG_GUARD_S)
        assert len(made) == CLIENTS
        assert len({id(protocol) for protocol in made}) == CLIENTS
        for number, client in enumerate(clients):  # each socket reaches its own protocol
            client.setblocking(False)
            await loop.sock_sendall(client, b"%d;" % number)
        for number, client in enumerate(clients):
            echoed = await asyncio.wait_for(loop.sock_recv(client, 64), HANG_GUARD_S)
            assert echoed == b"%d;" % number
        acceptor.close()
        assert sock.fileno() == -1  # no longer listening
    finally:
        _close_all(clients, made, sock)


def _close_all(clients: list[socket.socket], made: list[_Echo], sock: socket.socket) -> None:
    """Close the test's clients, the connections the server made, and its socket."""
    for client in clients:
        client.close()
    for protocol in made:
        if protocol.transport is not None:
            protocol.transport.close()
    sock.close()


def test_every_pending_connection_is_accepted_in_one_wake_up() -> None:
    uvloop.run(_every_pending_connection_in_one_call())


async def _out_of_descriptors() -> None:
    loop = asyncio.get_running_loop()
    sock = _listening()
    port = sock.getsockname()[1]
    made: list[_Echo] = []
    all_made = asyncio.Event()
    client = socket.create_connection(("127.0.0.1", port))
    try:
        acceptor = Acceptor(sock, lambda: _Echo(made, all_made, 1), loop)
        failing = mock.Mock(side_effect=OSError(errno.EMFILE, "Too many open files"))
        with mock.patch.object(loop, "call_later") as call_later:
            with mock.patch.object(socket.socket, "_accept", failing, create=True):
                acceptor.accept_pending()  # stops reading, retries later
            assert made == []
            (delay, resume), _ = call_later.call_args
            assert delay > 0
            assert "_accept" not in vars(socket.socket)
        resume()  # the retry: readable again, the waiting client is taken
        await asyncio.wait_for(all_made.wait(), HANG_GUARD_S)
        assert len(made) == 1
        acceptor.close()
    finally:
        _close_all([client], made, sock)


def test_out_of_descriptors_pauses_accepting_then_resumes() -> None:
    uvloop.run(_out_of_descriptors())


def test_an_accepted_socket_reads_its_family_and_type_as_plain_ints() -> None:
    listening = _listening()
    client = socket.create_connection(listening.getsockname())
    fd, _ = listening._accept()  # type: ignore[attr-defined]
    accepted = AcceptedSocket(listening.family, listening.type, listening.proto, fileno=fd)
    try:
        assert type(accepted.family) is int and accepted.family == socket.AF_INET
        assert type(accepted.type) is int and accepted.type == socket.SOCK_STREAM
        assert accepted.getpeername() == client.getsockname()
    finally:
        accepted.close()
        client.close()
        listening.close()
