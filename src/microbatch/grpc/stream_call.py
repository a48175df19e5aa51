"""One ``ModelStreamInfer`` call: the Open Inference Protocol's streaming extension
(Triton's, as ``tritonclient.grpc``'s ``start_stream`` and ``async_stream_infer``
speak it), many requests on one bidirectional gRPC call.

The client sends requests when it likes; each is answered on its own as soon as it
is ready, so answers may come in another order than their requests (each carries its
request's ``id``). The answers themselves are made by the server
(:class:`~microbatch.grpc.GrpcServer`); this module only runs a call:

* **Concurrent**: every request read is answered by a task of its own, so a slow
  request holds up no other, and rows of many requests share batches.
* **Bounded**: at most ``max_requests`` requests of a call in flight (the call is
  not read further until one ends, and gRPC's flow control then holds the client
  back), and at most ``max_responses`` responses waiting to be sent (the requests
  making more wait, and a stream's chunks meanwhile wait in its stream, up to the
  stage's ``max_buffered_chunks``).
* **Ends cleanly**: when the client has sent its last request, the call ends once
  every request is answered. A client that leaves, or a call past its deadline,
  cancels the requests in flight: their items are withdrawn (a stream's at its
  next step).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = ["Answer", "Send", "StreamCall"]

Send = Callable[[Any], Awaitable[None]]
"""Sends one response on the call (waits while ``max_responses`` are waiting)."""

Answer = Callable[[Any, Send], Awaitable[None]]
"""Answers one request with one or more responses; raises nothing (a request's
error is a response too)."""


class StreamCall:
    """One call's requests in, its responses out (see the module's docstring).

    Args:
        answer: Answers one request (see :data:`Answer`).
        max_requests: The most requests of this call in flight at once.
        max_responses: The most responses waiting to be sent.
    """

    def __init__(self, answer: Answer, *, max_requests: int, max_responses: int) -> None:
        self._answer = answer
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._room = asyncio.Semaphore(max_responses)
        self._slots = asyncio.Semaphore(max_requests)
        self._running: set[asyncio.Task[None]] = set()
        self._reader: asyncio.Task[None] | None = None

    async def responses(self, requests: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
        """The responses, as they are made, until every request the client sent
        (``requests``: ``grpc.aio``'s request iterator) is answered; closing it
        cancels what is in flight.

        Raises:
            Exception: What reading the requests raised (after the responses before it).
        """
        self._reader = reader = asyncio.create_task(self._read(requests))
        reader.add_done_callback(self._read_ended)
        try:
            while not isinstance(response := await self._outbox.get(), _Ended):
                self._room.release()
                yield response
            if response.error is not None:
                raise response.error
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Cancel the reading and every request in flight (the call ended: its
        client left, or its deadline passed). Called again, it does nothing more."""
        if self._reader is not None:
            self._reader.cancel()
        for task in list(self._running):
            task.cancel()

    async def _send(self, response: Any) -> None:
        await self._room.acquire()
        self._outbox.put_nowait(response)

    async def _one(self, request: Any) -> None:
        try:
            await self._answer(request, self._send)
        finally:
            self._slots.release()

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        running = self._running
        async for request in requests:
            await self._slots.acquire()
            task = asyncio.create_task(self._one(request))
            running.add(task)
            task.add_done_callback(running.discard)
        while running:
            await asyncio.wait(set(running))

    def _read_ended(self, reader: asyncio.Task[None]) -> None:
        if not reader.cancelled():
            self._outbox.put_nowait(_Ended(reader.exception()))


class _Ended:
    """Put on the queue when the reader has ended: every request read is answered
    and no more will come, or reading failed with ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
