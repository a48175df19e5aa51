"""A front process of ``microbatch serve --workers N``: HTTP here, the model in the hub.

The front serves the same :class:`~.app.HttpApp` as a single-process server
(routes, validation, codecs, limits, metrics), but its target is a
:class:`RelayTarget`: each decoded item goes to the hub (see :mod:`.hub`), which
batches the items of every front together. A stream's item goes there too; its
chunks come back one message each, and a caller that leaves cancels it. A caller
that reads more slowly than the chunks come (the HTTP writer waits for a slow
client) may have at most ``max_buffered_chunks`` of them waiting here: one more
ends its stream with :class:`~microbatch.streams.SlowReader` (after the chunks that
came) and cancels its item in the hub, so that no process buffers without bound.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any

from ..errors import StageFailed
from ..http.metrics import RequestCollector
from ..stats import ServiceStats
from ..streams import MAX_BUFFERED_CHUNKS, SlowReader
from ..timing import Timing
from ..types import Route
from ._messages import (
    STATE_INTERVAL_S,
    Cancel,
    Chunk,
    Counts,
    Hello,
    OpenStream,
    Result,
    State,
    StreamEnd,
    Submit,
)
from .relay import Channel, pack_item, pack_outcome, unpack_outcome

_HUB_GONE = "the serving process is gone"

__all__ = ["RelayTarget"]


class RelayTarget:
    """A :class:`~microbatch.types.Servable` whose items run in the hub process.

    Args:
        name: The served model's name (for the OpenAPI document).
        input_type: The type a request body decodes to.
        output_type: The type of a result.
        sock: This front's end of the socket pair the hub made.
        routes: The served model's routes (see :attr:`microbatch.types.Servable.routes`).
        on_hub_lost: Called if the hub goes away while this target is open (a front
            process shuts itself down then: nothing it takes could be answered).
        examples: The served model's example items (published in OpenAPI).
        streaming: The routes whose results stream (None: the whole model).
        embedding_model: The served model's ``embedding_model`` (see
            :mod:`microbatch.http.openai`), or None.
        completion_model: The served model's ``completion_model`` (see
            :mod:`microbatch.http.completions`), or None.
        max_buffered_chunks: Most chunks of one stream waiting for its caller.
    """

    def __init__(
        self,
        name: str,
        input_type: Any,
        output_type: Any,
        sock: socket.socket,
        routes: Mapping[str, Route] | None = None,
        on_hub_lost: Callable[[], None] | None = None,
        examples: Sequence[Any] = (),
        streaming: Collection[str | None] = (),
        embedding_model: object = None,
        max_buffered_chunks: int = MAX_BUFFERED_CHUNKS,
        completion_model: object = None,
    ) -> None:
        self.name = name
        self.max_buffered_chunks = max_buffered_chunks
        self.input_type = input_type
        self.output_type = output_type
        self.routes = dict(routes or {})
        self.examples = tuple(examples)
        self.embedding_model = embedding_model
        self.completion_model = completion_model
        self._streaming = frozenset(streaming)
        self._streams: dict[int, asyncio.Queue[Chunk | StreamEnd]] = {}
        self.requests: RequestCollector | None = None  # whose counts go to the hub
        self._sock = sock
        self._on_hub_lost = on_hub_lost
        self._channel = Channel(self._on_message, self._on_lost)
        self._waiting: dict[int, asyncio.Future[Result]] = {}
        self._ids = itertools.count()
        self._ready = False
        self._stats: ServiceStats | None = None
        self._told: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False

    @property
    def ready(self) -> bool:
        """The hub said it is ready (at most :data:`STATE_INTERVAL_S` ago)."""
        return self._ready and self._channel.open

    async def start(self) -> None:
        """Connect to the hub and wait for its first word on the state."""
        loop = asyncio.get_running_loop()
        self._told = loop.create_future()
        await loop.connect_accepted_socket(lambda: self._channel, self._sock)
        self._channel.post(Hello())
        await self._told
        self._timer = loop.call_later(STATE_INTERVAL_S, self._report_counts)

    async def close(self) -> None:
        """Report the last counts and disconnect (the hub closes the service)."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if self.requests is not None and self._channel.open:
            self._channel.post(Counts(self.requests.snapshot()))
        self._channel.close()

    async def submit(
        self,
        item: Any,
        *,
        deadline: float | None = None,
        route: str | None = None,
        timing: Timing | None = None,
    ) -> Any:
        """Send the item to the hub; return its result or raise its error. The hub's
        stage timings are appended to ``timing``, when given."""
        if not self._channel.open:
            raise StageFailed("the serving process is gone")
        request_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        packed = pack_item(item)
        traced = "" if timing is None or timing.span is None else timing.tracer.traceparent(timing)
        self._channel.post(Submit(request_id, packed, deadline, route, timing is not None, traced))
        try:
            result: Result = await answer
        except asyncio.CancelledError:
            if self._waiting.pop(request_id, None) is not None:
                self._channel.post(Cancel(request_id))
            raise
        if timing is not None:
            timing.stages.extend(result.stages)
            timing.stage = result.stage  # a failure's Server-Timing names the stage
        return unpack_outcome(result.outcome)

    def can_stream(self, route: str | None = None) -> bool:
        """Whether :meth:`stream` works for ``route``."""
        return route in self._streaming

    def stream(
        self,
        item: Any,
        *,
        deadline: float | None = None,
        route: str | None = None,
        first_chunk_deadline: float | None = None,
    ) -> AsyncIterator[Any]:
        """Stream the item in the hub; its chunks as they come, then its end (or its
        error, raised). Closing the iteration early cancels it in the hub."""
        if not self.can_stream(route):
            raise TypeError(f"route {route!r} does not stream")
        return self._relayed_stream(item, deadline, route, first_chunk_deadline)

    async def _relayed_stream(
        self,
        item: Any,
        deadline: float | None,
        route: str | None,
        first_chunk_deadline: float | None,
    ) -> AsyncIterator[Any]:
        if not self._channel.open:
            raise StageFailed(_HUB_GONE)
        request_id = next(self._ids)
        messages: asyncio.Queue[Chunk | StreamEnd] = asyncio.Queue()
        self._streams[request_id] = messages
        self._channel.post(
            OpenStream(request_id, pack_item(item), deadline, first_chunk_deadline, route)
        )
        try:
            while True:
                message = await messages.get()
                if isinstance(message, StreamEnd):
                    unpack_outcome(message.outcome)  # raises the stream's error
                    return
                yield unpack_outcome(message.chunk)
        finally:
            if self._streams.pop(request_id, None) is not None and self._channel.open:
                self._channel.post(Cancel(request_id))  # the caller left early

    def stats(self) -> ServiceStats:
        """The service's stats, as the hub last told them."""
        return ServiceStats(False, self._closing, 0, ()) if self._stats is None else self._stats

    def _on_message(self, message: object) -> None:
        if isinstance(message, Chunk):
            stream = self._streams.get(message.request_id)
            if stream is None:
                return
            if stream.qsize() < self.max_buffered_chunks:
                stream.put_nowait(message)
                return
            # Its caller reads too slowly: end it after what came, free its item.
            del self._streams[message.request_id]
            slow = pack_outcome(False, SlowReader.after(stream.qsize()))
            stream.put_nowait(StreamEnd(message.request_id, slow))
            if self._channel.open:
                self._channel.post(Cancel(message.request_id))
        elif isinstance(message, StreamEnd):
            stream = self._streams.pop(message.request_id, None)
            if stream is not None:
                stream.put_nowait(message)
        elif isinstance(message, Result):
            answer = self._waiting.pop(message.request_id, None)
            if answer is not None and not answer.done():
                answer.set_result(message)
        elif isinstance(message, State):
            self._ready, self._stats = message.ready, message.stats
            if self.requests is not None:
                self.requests.others = message.others
            if self._told is not None and not self._told.done():
                self._told.set_result(None)

    def _on_lost(self) -> None:
        """The hub is gone: every waiting item fails (503), and the owner is told."""
        self._ready = False
        waiting, self._waiting = self._waiting, {}
        for answer in waiting.values():
            if not answer.done():
                answer.set_exception(StageFailed(_HUB_GONE))
        streams, self._streams = self._streams, {}
        gone = pack_outcome(False, StageFailed(_HUB_GONE))
        for request_id, stream in streams.items():
            stream.put_nowait(StreamEnd(request_id, gone))
        if self._told is not None and not self._told.done():
            self._told.set_exception(StageFailed("the serving process is gone"))
        if not self._closing and self._on_hub_lost is not None:
            self._on_hub_lost()

    def _report_counts(self) -> None:
        if self.requests is not None:
            self._channel.post(Counts(self.requests.snapshot()))
        self._timer = asyncio.get_running_loop().call_later(STATE_INTERVAL_S, self._report_counts)
