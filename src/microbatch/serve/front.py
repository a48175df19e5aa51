"""A front process of ``microbatch serve --workers N``: HTTP here, the model in the hub.

The front serves the same :class:`~.app.HttpApp` as a single-process server
(routes, validation, codecs, limits, metrics), but its target is a
:class:`RelayTarget`: each decoded item goes to the hub (see :mod:`.hub`), which
batches the items of every front together.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import StageFailed
from ..http.metrics import RequestCollector
from ..stats import ServiceStats
from ..timing import Timing
from ..types import Route
from ._messages import STATE_INTERVAL_S, Cancel, Counts, Hello, Result, State, Submit
from .relay import Channel, pack_item, unpack_outcome

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
    ) -> None:
        self.name = name
        self.input_type = input_type
        self.output_type = output_type
        self.routes = dict(routes or {})
        self.examples = tuple(examples)
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
        return unpack_outcome(result.outcome)

    def stats(self) -> ServiceStats:
        """The service's stats, as the hub last told them."""
        return ServiceStats(False, self._closing, 0, ()) if self._stats is None else self._stats

    def _on_message(self, message: object) -> None:
        if isinstance(message, Result):
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
                answer.set_exception(StageFailed("the serving process is gone"))
        if self._told is not None and not self._told.done():
            self._told.set_exception(StageFailed("the serving process is gone"))
        if not self._closing and self._on_hub_lost is not None:
            self._on_hub_lost()

    def _report_counts(self) -> None:
        if self.requests is not None:
            self._channel.post(Counts(self.requests.snapshot()))
        self._timer = asyncio.get_running_loop().call_later(STATE_INTERVAL_S, self._report_counts)
