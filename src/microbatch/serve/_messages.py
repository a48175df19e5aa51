"""The messages between ``serve --workers``'s front processes and their hub.

Small frozen dataclasses, pickled only on the socket pairs between our own processes
(see :mod:`.relay`). Items and outcomes travel inside as bytes of their own (see
:func:`.relay.pack_item`, :func:`.relay.pack_outcome`), so that one that cannot be
read fails alone and not the whole frame.

front to hub
    :class:`Hello` once connected; :class:`Submit` for each item; :class:`OpenStream`
    for each item whose chunks are streamed; :class:`Cancel` when its caller went
    away (a request or a stream); :class:`Counts` now and then (the requests the front
    served, for everybody's ``/metrics``).
hub to front
    :class:`Result` for each item; :class:`Chunk` for each chunk of a stream, then
    :class:`StreamEnd` (its end, or its error); :class:`State` on connecting and every
    :data:`STATE_INTERVAL_S` (readiness, the service's stats, the other fronts'
    request counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..http.metrics import RequestCounts
from ..stats import ServiceStats
from ..timing import StageTiming

__all__ = [
    "STATE_INTERVAL_S",
    "Cancel",
    "Chunk",
    "Counts",
    "FrontMessage",
    "Hello",
    "HubMessage",
    "OpenStream",
    "Result",
    "State",
    "StreamEnd",
    "Submit",
]

STATE_INTERVAL_S = 0.5
"""How often the hub tells every front its readiness and stats (and how often the
fronts report their request counts): how stale a probe or a scrape may be."""


# Each message pickles as its class and its fields' values (``__reduce__``), not as a
# dict of field names: bursts of thousands of messages a second cross the relay.
_Reduced = tuple[type, tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Hello:
    """A front is connected and ready to relay."""

    def __reduce__(self) -> _Reduced:
        return Hello, ()


@dataclass(frozen=True, slots=True)
class Submit:
    """One item for the service.

    Attributes:
        request_id: The front's id of the request (unique per front).
        item: The decoded item, pickled on its own.
        deadline: When the caller stops waiting, in ``time.monotonic()`` time (which
            every process of the machine shares), worked out where the request
            entered; or None.
        route: One of the service's routes, or None for the whole model.
        timed: Whether the caller wants the item's stage timings back (``Server-Timing``).
        traceparent: The W3C ``traceparent`` of the front's request span, when traced.
    """

    request_id: int
    item: bytes
    deadline: float | None
    route: str | None
    timed: bool = False
    traceparent: str = ""

    def __reduce__(self) -> _Reduced:
        fields = (self.request_id, self.item, self.deadline, self.route, self.timed)
        return Submit, (*fields, self.traceparent)


@dataclass(frozen=True, slots=True)
class OpenStream:
    """One item whose chunks are to be streamed back (:class:`Chunk`, then
    :class:`StreamEnd`).

    Attributes:
        request_id: The front's id of the stream (unique per front, shared with
            :class:`Submit`'s ids).
        item: The decoded item, pickled on its own.
        deadline: When the whole stream must end (``time.monotonic()``), or None.
        first_chunk_deadline: When the first chunk must come, or None.
        route: One of the service's routes, or None for the whole model.
    """

    request_id: int
    item: bytes
    deadline: float | None
    first_chunk_deadline: float | None
    route: str | None

    def __reduce__(self) -> _Reduced:
        return OpenStream, (
            self.request_id,
            self.item,
            self.deadline,
            self.first_chunk_deadline,
            self.route,
        )


@dataclass(frozen=True, slots=True)
class Cancel:
    """The caller of ``request_id`` went away: drop its item."""

    request_id: int

    def __reduce__(self) -> _Reduced:
        return Cancel, (self.request_id,)


@dataclass(frozen=True, slots=True)
class Counts:
    """The requests one front has served so far."""

    counts: RequestCounts

    def __reduce__(self) -> _Reduced:
        return Counts, (self.counts,)


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of one item: its result or its error, packed by
    :func:`.relay.pack_outcome`; with the item's stage timings when it was
    submitted ``timed``."""

    request_id: int
    outcome: bytes
    stages: tuple[StageTiming, ...] = ()
    stage: str = ""  # the stage a timed item was last in (where it failed, if it did)

    def __reduce__(self) -> _Reduced:
        return Result, (self.request_id, self.outcome, self.stages, self.stage)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of stream ``request_id``, packed by :func:`.relay.pack_outcome`."""

    request_id: int
    chunk: bytes

    def __reduce__(self) -> _Reduced:
        return Chunk, (self.request_id, self.chunk)


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Stream ``request_id`` ended: ``outcome`` (packed by
    :func:`.relay.pack_outcome`) is None, or the stream's error."""

    request_id: int
    outcome: bytes

    def __reduce__(self) -> _Reduced:
        return StreamEnd, (self.request_id, self.outcome)


@dataclass(frozen=True, slots=True)
class State:
    """What a front answers probes and scrapes with.

    Attributes:
        ready: The service is ready and the hub not draining.
        stats: The service's stats.
        others: The request counts of every other front (gone ones included).
    """

    ready: bool
    stats: ServiceStats
    others: RequestCounts

    def __reduce__(self) -> _Reduced:
        return State, (self.ready, self.stats, self.others)


FrontMessage = Hello | Submit | OpenStream | Cancel | Counts
"""What a front sends its hub."""

HubMessage = Result | Chunk | StreamEnd | State
"""What the hub sends a front."""
