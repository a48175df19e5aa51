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
  making more wait: a stream's item waits at its next chunk).
* **Ends cleanly**: when the client has sent its last request, the call ends once
  every request is answered. A client that leaves, or a call past its deadline,
  cancels the requests in flight: their items are withdrawn (a stream's at its
  next step).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = ["Answer", "Send", "serve_stream_call"]

Send = Callable[[Any], Awaitable[None]]
"""Sends one response on the call (waits while ``max_responses`` are waiting)."""

Answer = Callable[[Any, Send], Awaitable[None]]
"""Answers one request with one or more responses; raises nothing (a request's
error is a response too)."""


async def serve_stream_call(
    requests: AsyncIterator[Any],
    answer: Answer,
    *,
    max_requests: int,
    max_responses: int,
) -> AsyncGenerator[Any, None]:
    """The responses of one call, as they are made, until every request the client
    sent is answered.

    Args:
        requests: The call's requests (``grpc.aio``'s request iterator).
        answer: Answers one request (see :data:`Answer`).
        max_requests: The most requests of this call in flight at once.
        max_responses: The most responses waiting to be sent.

    Raises:
        Exception: What reading the requests raised (after the responses before it).
    """
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    room = asyncio.Semaphore(max_responses)
    slots = asyncio.Semaphore(max_requests)
    running: set[asyncio.Task[None]] = set()

    async def send(response: Any) -> None:
        await room.acquire()
        outbox.put_nowait(response)

    async def one(request: Any) -> None:
        try:
            await answer(request, send)
        finally:
            slots.release()

    async def read() -> None:
        async for request in requests:
            await slots.acquire()
            task = asyncio.create_task(one(request))
            running.add(task)
            task.add_done_callback(running.discard)
        while running:
            await asyncio.wait(set(running))

    def read_ended(task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            outbox.put_nowait(_Ended(task.exception()))

    reader = asyncio.create_task(read())
    reader.add_done_callback(read_ended)
    try:
        while not isinstance(response := await outbox.get(), _Ended):
            room.release()
            yield response
        if response.error is not None:
            raise response.error
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()


class _Ended:
    """Put on the queue when the reader has ended: every request read is answered
    and no more will come, or reading failed with ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
