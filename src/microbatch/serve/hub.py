"""The hub of ``microbatch serve --workers N``: one Service, fed by N HTTP processes.

Each front process parses, validates and encodes HTTP on a core of its own and
relays the decoded items here over a :class:`~microbatch.serve.relay.Channel`; the hub submits
them to the one Service, so the items of every front share the same batches and
the same model workers. Each outcome goes back to the front that asked; a stream's
chunks go back one message each as they come, then its end (a front whose caller
left cancels it, which frees the item's place at the next step).

The messages are the dataclasses of :mod:`._messages`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from ..http.metrics import RequestCounts
from ..streams import stop_reading
from ..timing import Timing, accepts_timing
from ..types import Servable, StreamingServable
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

if TYPE_CHECKING:
    from ..tracing import Tracer
from .relay import Channel, pack_outcome, unpack_item

__all__ = ["Hub"]

logger = logging.getLogger("microbatch.http")


class Hub:
    """Runs the items of every connected front through one :class:`~microbatch.types.Servable`.

    Args:
        target: The started Service (or batched function) to feed.
        tracer: Traces the items the fronts send traced (their ``traceparent``):
            a span per item, a child of the front's request span, and the batches.
    """

    def __init__(self, target: Servable[Any, Any], tracer: Tracer | None = None) -> None:
        self.target = target
        self.tracer = tracer
        self.takes_timing = accepts_timing(target)
        # The Service's submit without a task per item, where its routes allow it.
        self.submit_nowait: Any = getattr(target, "submit_nowait", None)
        self.serving = False  # every front is up
        self.draining = False
        self._links: dict[int, _FrontLink] = {}
        self._retired = RequestCounts()  # the counts of fronts that are gone
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False

    async def connect(self, index: int, sock: socket.socket) -> asyncio.Future[None]:
        """Serve front ``index`` on ``sock`` (the hub's end of its socket pair); the
        future returned is done when the front has said hello."""
        loop = asyncio.get_running_loop()
        link = _FrontLink(self, index)
        self._links[index] = link
        await loop.connect_accepted_socket(lambda: link.channel, sock)
        link.channel.post(self._state_for(index))
        if self._timer is None:
            self._timer = loop.call_later(STATE_INTERVAL_S, self._tell_state)
        return link.hello

    def lost(self, link: _FrontLink) -> None:
        """A front is gone: cancel its items, keep its counts."""
        if self._links.get(link.index) is link:
            del self._links[link.index]
            if not self._closing:
                logger.warning(
                    "HTTP process %d went away; its %d item(s) in flight are cancelled",
                    link.index,
                    len(link.tasks),
                )
            link.drop()
            self._retired.add(link.counts)

    def close(self) -> None:
        """Stop telling fronts the state; close every link."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for link in list(self._links.values()):
            link.channel.close()
            self.lost(link)

    def _tell_state(self) -> None:
        for index, link in self._links.items():
            link.channel.post(self._state_for(index))
        self._timer = asyncio.get_running_loop().call_later(STATE_INTERVAL_S, self._tell_state)

    def _state_for(self, index: int) -> State:
        others = RequestCounts()
        others.add(self._retired)
        for peer, link in self._links.items():
            if peer != index:
                others.add(link.counts)
        ready = self.target.ready and not self.draining
        return State(ready, self.target.stats(), others)


class _FrontLink:
    """The hub's side of one front: its items in flight and its request counts."""

    def __init__(self, hub: Hub, index: int) -> None:
        self.hub = hub
        self.index = index
        self.channel = Channel(self._on_message, partial(hub.lost, self))
        self.tasks: dict[int, asyncio.Future[Any]] = {}  # a task, or a future (nowait)
        self.counts = RequestCounts()
        self.hello: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def drop(self) -> None:
        """The front is gone: nobody waits for its items."""
        tasks, self.tasks = self.tasks, {}
        for task in tasks.values():
            task.cancel()
        if not self.hello.done():
            self.hello.set_exception(ConnectionError(f"front {self.index} went away"))

    def _on_message(self, message: object) -> None:
        if isinstance(message, Submit):
            self._submit(message)
        elif isinstance(message, OpenStream):
            self._open_stream(message)
        elif isinstance(message, Cancel):
            cancelled = self.tasks.get(message.request_id)
            if cancelled is not None:
                cancelled.cancel()
        elif isinstance(message, Counts):
            self.counts = message.counts
        elif isinstance(message, Hello) and not self.hello.done():
            self.hello.set_result(None)

    def _submit(self, message: Submit) -> None:
        request_id = message.request_id
        try:
            item = unpack_item(message.item)
        except Exception as error:
            self.channel.post(Result(request_id, pack_outcome(False, error)))
            return
        hub = self.hub
        timing: Timing | None = None
        if message.timed and hub.takes_timing:
            timing = Timing(time.monotonic())
            if message.traceparent and hub.tracer is not None:
                parent = ((b"traceparent", message.traceparent.encode("latin-1")),)
                hub.tracer.start_request(timing, "microbatch hub", parent)
        timed = {} if timing is None else {"timing": timing}
        answer: asyncio.Future[Any] | None = None
        if hub.submit_nowait is not None and (timing is None or timing.span is None):
            try:  # no task for the item: its future (None where the route needs one)
                answer = hub.submit_nowait(
                    item, deadline=message.deadline, route=message.route, **timed
                )
            except Exception as error:  # refused at once (the stage it reached, timed)
                self._answer(request_id, pack_outcome(False, error), timing)
                return
        if answer is None:
            submitted = hub.target.submit(
                item, deadline=message.deadline, route=message.route, **timed
            )
            answer = asyncio.get_running_loop().create_task(submitted)
        self.tasks[request_id] = answer
        answer.add_done_callback(partial(self._finished, request_id, timing))

    def _open_stream(self, message: OpenStream) -> None:
        request_id = message.request_id
        try:
            item = unpack_item(message.item)
        except Exception as error:
            self.channel.post(StreamEnd(request_id, pack_outcome(False, error)))
            return
        task = asyncio.get_running_loop().create_task(self._relay_stream(message, item))
        self.tasks[request_id] = task
        task.add_done_callback(partial(self._stream_ended, request_id))

    async def _relay_stream(self, message: OpenStream, item: Any) -> None:
        """Send each chunk of the item's stream to the front as it comes."""
        target = self.hub.target
        if not isinstance(target, StreamingServable):
            raise TypeError("the served model does not stream")
        chunks = target.stream(
            item,
            deadline=message.deadline,
            route=message.route,
            first_chunk_deadline=message.first_chunk_deadline,
        )
        try:
            async for chunk in chunks:
                self.channel.post(Chunk(message.request_id, pack_outcome(True, chunk)))
        finally:
            await stop_reading(chunks)  # cancelled: the item leaves at the next step

    def _stream_ended(self, request_id: int, task: asyncio.Task[None]) -> None:
        if self.tasks.pop(request_id, None) is None or task.cancelled():
            return  # the front cancelled it, or is gone
        error = task.exception()
        outcome = pack_outcome(True, None) if error is None else pack_outcome(False, error)
        self.channel.post(StreamEnd(request_id, outcome))

    def _finished(self, request_id: int, timing: Timing | None, task: asyncio.Future[Any]) -> None:
        if timing is not None and timing.span is not None:
            timing.tracer.end_request(timing, None if task.cancelled() else task.exception())
        if self.tasks.pop(request_id, None) is None or task.cancelled():
            return  # the front asked to cancel it, or is gone
        error = task.exception()
        outcome = pack_outcome(True, task.result()) if error is None else pack_outcome(False, error)
        self._answer(request_id, outcome, timing)

    def _answer(self, request_id: int, outcome: bytes, timing: Timing | None) -> None:
        """Send an item's outcome to its front, with its stage timings if it asked."""
        if timing is None:
            self.channel.post(Result(request_id, outcome))
        else:
            self.channel.post(Result(request_id, outcome, tuple(timing.stages), timing.stage))
