"""What happened to one request, stage by stage: the record behind ``Server-Timing``.

A front door that wants to tell its caller why a request took what it took makes a
:class:`Timing` and passes it down with the item (``submit(..., timing=timing)``);
each batcher the item goes through appends one :class:`StageTiming` when the item's
batch is done. Nothing is allocated or measured when no record is passed.

:meth:`Timing.header` renders the record as a W3C ``Server-Timing`` value
(https://www.w3.org/TR/server-timing/), durations in milliseconds::

    embed.queue;dur=1.20, embed.behind;dur=0.31, embed.model;dur=5.04,
    embed.batch;desc="size=8 cost=412", total;dur=6.90

A request that failed gets what is known (:meth:`Timing.failure_value`): the
entries of the stages it finished, then the stage it failed in, with the time it
spent there (queued until shed or expired, or its batch's time) and the error::

    embed.failed;dur=812.40;desc="DeadlineExceeded", total;dur=812.61

and a request refused before it had a record, only the error and its total
(:func:`refused_value`)::

    failed;desc="Unauthorized", total;dur=0.04
"""

from __future__ import annotations

import inspect
import re
from typing import Any, NamedTuple

__all__ = [
    "SERVER_TIMING_HEADER",
    "BatchPart",
    "StageTiming",
    "Timing",
    "accepts_timing",
    "failure_line",
    "metric_name",
    "refused_value",
]

SERVER_TIMING_HEADER = b"server-timing"
"""The response header's name, in lower case."""

_NOT_TOKEN = re.compile(r"[^A-Za-z0-9!#$%&'*+.^_`|~-]")
_NAMES: dict[str, bytes] = {}  # stage name -> metric name, worked out once each
_REST = b'%s.behind;dur=%.2f, %s.model;dur=%.2f, %s.batch;desc="size=%d'
# A one-stage record's times (every request's) are written from these pieces: about
# 40% cheaper than a %-template's two %.2f (benchmarks/front_instructions.py).
_LINE_START = b"server-timing: "  # an HTTP/1.1 response head's line, before the value
_WHOLE_MS = [str(ms).encode() for ms in range(1000)]  # "0" .. "999"
_HUNDREDTHS = [b".%02d" % hundredths for hundredths in range(100)]  # ".00" .. ".99"
_new_tuple = tuple.__new__  # a StageTiming without its generated __new__'s cost
_FAILED = b'%s;dur=%.2f;desc="%s", total;dur=%.2f'
_REFUSED = b'failed;desc="%s", total;dur=%.2f'
_NOT_QUOTABLE = re.compile(rb"[^ !#-\[\]-~]")  # what a quoted-string cannot carry as is


def metric_name(stage: str) -> str:
    """``stage`` as a ``Server-Timing`` metric name (an HTTP token: other characters
    become ``_``)."""
    return _NOT_TOKEN.sub("_", stage) or "_"


def _metric(stage: str) -> bytes:
    name = _NAMES.get(stage)
    if name is None:
        name = metric_name(stage).encode("ascii")
        if len(_NAMES) < 1024:  # stage names are the servable's, few; bounded anyway
            _NAMES[stage] = name
    return name


class StageTiming(NamedTuple):
    """One stage's part in one request, in seconds.

    Attributes:
        stage: The stage (or batched function) name.
        queued_s: From the item's arrival in the stage's queue to its batch's release.
        behind_s: From the release to the model's start on the batch (waiting behind
            a running batch, or for a worker).
        model_s: The model's time on the whole batch.
        batch_size: The batch's size in batch units (as ``max_batch_size`` counts).
        batch_cost: The batch's total cost, when the stage has a ``cost_fn``.
    """

    stage: str
    queued_s: float
    behind_s: float
    model_s: float
    batch_size: int
    batch_cost: float | None = None


class BatchPart:
    """One batch's part of the entries of the requests in it, shared by them: what
    every item of the batch has alike, with its ``Server-Timing`` text rendered once.
    An item's own part is its arrival (so its time queued).

    Attributes:
        stage: The name the entries are recorded under.
        released_s: When the batcher let the batch go.
        behind_s: From the release to the model's start.
        model_s: The model's time on the batch.
        batch_size: The batch's size in batch units.
        batch_cost: Its total cost, when the stage has a ``cost_fn``.
    """

    __slots__ = (
        "batch_cost",
        "batch_size",
        "behind_s",
        "model_s",
        "queue",
        "released_s",
        "rest",
        "stage",
    )

    def __init__(
        self,
        stage: str,
        released_s: float,
        behind_s: float,
        model_s: float,
        batch_size: int,
        batch_cost: float | None,
    ) -> None:
        self.stage = stage
        self.released_s = released_s
        self.behind_s = behind_s
        self.model_s = model_s
        self.batch_size = batch_size
        self.batch_cost = batch_cost
        name = _metric(stage)
        rest = _REST % (name, behind_s * 1e3, name, model_s * 1e3, name, batch_size)
        if batch_cost is not None:
            rest += b" cost=%s" % f"{batch_cost:g}".encode("ascii")
        self.queue = name + b".queue;dur="  # then the item's queued time
        self.rest = rest + b'", '  # the batch's metrics after it, and the separator

    def entry(self, arrival_s: float) -> StageTiming:
        """The whole entry of an item that arrived at ``arrival_s``."""
        queued = self.released_s - arrival_s
        return _new_tuple(
            StageTiming,
            (
                self.stage,
                queued if queued > 0.0 else 0.0,
                self.behind_s,
                self.model_s,
                self.batch_size,
                self.batch_cost,
            ),
        )


class Timing:
    """The mutable per-request record a front door passes down with one item.

    The latest stage's entry is kept as its batch's shared :class:`BatchPart` and
    the item's arrival (:meth:`add`), so that recording it and telling it allocate
    nothing per request; :attr:`stages` makes the entries whole when read.

    Attributes:
        start_s: When the request entered (``time.monotonic()`` scale, or the
            test's clock).
        stage: The name the next batcher records under (set by a
            :class:`~microbatch.Service` before each stage; a batched function uses
            its own name when this is empty).
        span: The request's OpenTelemetry span, when traced (see
            :mod:`microbatch.tracing`), else None.
        tracer: The :class:`~microbatch.tracing.Tracer` that made ``span``, else None.
        told: Whether the response tells it (``Server-Timing``): False for a record
            kept only for a trace.
    """

    __slots__ = ("_arrival", "_earlier", "_part", "span", "stage", "start_s", "told", "tracer")

    def __init__(
        self,
        start_s: float,
        stage: str = "",
        stages: list[StageTiming] | None = None,
        span: Any = None,
        tracer: Any = None,
        told: bool = True,
    ) -> None:
        self.start_s = start_s
        self.stage = stage
        self.span = span
        self.tracer = tracer
        self.told = told
        self._earlier = stages  # the entries before the latest one (None: none yet)
        self._part: BatchPart | None = None  # the latest entry's batch, if any
        self._arrival = 0.0  # and the item's arrival in it

    def __repr__(self) -> str:
        return f"Timing(start_s={self.start_s!r}, stage={self.stage!r}, stages={self.stages!r})"

    @property
    def stages(self) -> list[StageTiming]:
        """One entry per stage the item went through, in order (a list the caller
        may extend)."""
        return self._whole()

    def add(self, part: BatchPart, arrival_s: float) -> None:
        """Append the entry of a batch (``part``) the item arrived in at
        ``arrival_s``."""
        if self._part is not None:
            self._whole()
        self._part, self._arrival = part, arrival_s

    def _whole(self) -> list[StageTiming]:
        """The entries, the latest one (kept as its batch's part) made whole."""
        earlier = self._earlier
        if earlier is None:
            earlier = self._earlier = []
        part = self._part
        if part is not None:
            earlier.append(part.entry(self._arrival))
            self._part = None
        return earlier

    def record(
        self,
        stage: str,
        queued_s: float,
        behind_s: float,
        model_s: float,
        batch_size: int,
        batch_cost: float | None = None,
    ) -> None:
        """Append one stage's entry (under :attr:`stage` when it is set)."""
        entry = (self.stage or stage, queued_s, behind_s, model_s, batch_size, batch_cost)
        self.stages.append(_new_tuple(StageTiming, entry))

    def header(self, end_s: float) -> str:
        """The ``Server-Timing`` value for a response finished at ``end_s``."""
        return self.header_value(end_s).decode("ascii")

    def header_value(self, end_s: float) -> bytes:
        """:meth:`header`, as the bytes a response head carries."""
        part = self._part
        if part is not None and not self._earlier:  # the common case: one stage
            return self._one_stage(b"", part, end_s, b"")
        parts = [_entry(entry) for entry in self.stages]
        parts.append(b"total;dur=%.2f" % ((end_s - self.start_s) * 1e3))
        return b"".join(parts)

    def failure_value(self, end_s: float, error: str) -> bytes:
        """The ``Server-Timing`` value for a request that failed with ``error`` (its
        name, e.g. ``DeadlineExceeded``) at ``end_s``: the entries of the stages
        whose batches it finished, then ``<stage>.failed`` (the stage it was in: the
        last one set in :attr:`stage`, else plain ``failed``) with the time not
        accounted for by those entries (queued until shed or expired, or in a batch
        that failed), then the total."""
        total = end_s - self.start_s
        accounted = 0.0
        parts = []
        for entry in self.stages:
            accounted += entry.queued_s + entry.behind_s + entry.model_s
            parts.append(_entry(entry))
        name = _metric(self.stage) + b".failed" if self.stage else b"failed"
        in_stage = max(total - accounted, 0.0)
        parts.append(_FAILED % (name, in_stage * 1e3, _quotable(error), total * 1e3))
        return b"".join(parts)

    def header_line(self, end_s: float) -> bytes:
        """The whole ``server-timing: ...\r\n`` line of an HTTP/1.1 response head
        (empty when not :attr:`told`)."""
        if not self.told:
            return b""
        part = self._part
        if part is not None and not self._earlier:  # the common case: one stage
            return self._one_stage(_LINE_START, part, end_s, b"\r\n")
        return _LINE_START + self.header_value(end_s) + b"\r\n"

    def _one_stage(self, start: bytes, part: BatchPart, end_s: float, end: bytes) -> bytes:
        """The value for a record whose one entry is ``part``'s, between ``start`` and
        ``end``: "<stage>.queue;dur=" queued ", " the part's rest "total;dur=" total."""
        queued = _ms_text(part.released_s - self._arrival)
        total = _ms_text(end_s - self.start_s)
        return b"".join((start, part.queue, queued, b", ", part.rest, b"total;dur=", total, end))


def _ms_text(seconds: float) -> bytes:
    """``seconds`` in milliseconds to the nearest hundredth, as %.2f writes it but at
    an exact tie (0 for a negative time)."""
    hundredths = int(seconds * 1e5 + 0.5) if seconds > 0.0 else 0
    if hundredths < 100_000:
        return _WHOLE_MS[hundredths // 100] + _HUNDREDTHS[hundredths % 100]
    return b"%d.%02d" % (hundredths // 100, hundredths % 100)


def refused_value(elapsed_s: float, error: str) -> bytes:
    """The ``Server-Timing`` value for a request that failed with ``error`` before
    it had a record (refused at its headers, or a route without one), ``elapsed_s``
    after it came in."""
    return _REFUSED % (_quotable(error), elapsed_s * 1e3)


def failure_line(timing: Timing | None, elapsed_s: float, end_s: float, error: str) -> bytes:
    """The whole ``server-timing: ...\r\n`` line of a failed request's response
    head: from its record when it has one (``end_s`` on the record's clock), else
    from ``elapsed_s`` (empty for a record that is not :attr:`~Timing.told`)."""
    if timing is None:
        return _LINE_START + refused_value(elapsed_s, error) + b"\r\n"
    if not timing.told:
        return b""
    return _LINE_START + timing.failure_value(end_s, error) + b"\r\n"


def _entry(entry: StageTiming) -> bytes:
    """One stage's four metrics, with the separator after them."""
    part = BatchPart(entry[0], 0.0, entry[2], entry[3], entry[4], entry[5])
    return b"%s%.2f, %s" % (part.queue, entry[1] * 1e3, part.rest)


def _quotable(text: str) -> bytes:
    """``text`` fit for a ``desc="..."`` value (other characters become ``_``)."""
    return _NOT_QUOTABLE.sub(b"_", text.encode("ascii", "replace"))


def accepts_timing(servable: Any) -> bool:
    """Whether ``servable.submit`` takes a ``timing`` keyword (every in-tree servable
    does; a user's own :class:`~microbatch.types.Servable` need not)."""
    try:
        parameters = inspect.signature(servable.submit).parameters
    except (TypeError, ValueError):
        return False
    return "timing" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
