"""OpenTelemetry traces of requests and batches (the optional ``microbatch[otel]``).

One span per request (``POST /predict``, a child of the caller's W3C ``traceparent``
when it sent one), one child span per stage it went through, and one span per batch
*linked* to the request spans of every item in it (span links model the fan-in:
one batch serves many requests). A batch run in a worker process is traced here,
in the serving process, from the start and finish times the worker reported.

Off unless asked for (``microbatch serve --otel``, :class:`~microbatch.http.HttpConfig`
``tracing=True``, or a :class:`Tracer` given to the app): then nothing here is
imported by the hot path and no span is made. Spans go to the global
OpenTelemetry tracer provider; :func:`configure` installs one when none is set.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from ._batch_timing import traced_stream
from .streams import stop_reading
from .timing import Timing, accepts_timing

__all__ = ["TracedStream", "Tracer", "available", "configure", "current_traceparent"]

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - without the otel extra
    trace = None  # type: ignore[assignment]

_TRACE_HEADERS = (b"traceparent", b"tracestate")


def available() -> bool:
    """Whether the OpenTelemetry API is installed (``pip install microbatch[otel]``)."""
    return trace is not None


def _epoch_ns(monotonic_s: float, offset_ns: int | None = None) -> int:
    """A ``time.monotonic()`` time as the wall-clock nanoseconds spans carry
    (``offset_ns``: :func:`_offset_ns`, read once for several times of one batch)."""
    if offset_ns is None:
        offset_ns = _offset_ns()
    return offset_ns + int(monotonic_s * 1e9)


def _offset_ns() -> int:
    """Wall-clock nanoseconds minus ``time.monotonic()`` nanoseconds, now."""
    return time.time_ns() - time.monotonic_ns()


def current_traceparent() -> str:
    """The W3C ``traceparent`` of the caller's current span ("" when there is none,
    or OpenTelemetry is not installed): what a client sends along with an item to
    another process (a Ray replica) so that the item's spans there are its children."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent", "")


class Tracer:
    """Makes microbatch's spans.

    Args:
        tracer: An OpenTelemetry tracer (default: ``microbatch``'s from the global
            provider).

    Raises:
        RuntimeError: OpenTelemetry is not installed.
    """

    def __init__(self, tracer: Any = None) -> None:
        if trace is None:
            raise RuntimeError("tracing needs OpenTelemetry: pip install 'microbatch[otel]'")
        self._tracer = tracer if tracer is not None else trace.get_tracer("microbatch")
        self._propagator = TraceContextTextMapPropagator()

    def start_request(
        self, timing: Timing, name: str, headers: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """Start ``timing``'s request span, a child of the request's ``traceparent``."""
        carrier = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in headers
            if key in _TRACE_HEADERS
        }
        parent = self._propagator.extract(carrier) if carrier else None
        timing.span = self._tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, start_time=_epoch_ns(timing.start_s)
        )
        timing.tracer = self

    def traceparent(self, timing: Timing) -> str:
        """The W3C ``traceparent`` of ``timing``'s request span ("" when untraced),
        to carry it to another process."""
        if timing.span is None:
            return ""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=trace.set_span_in_context(timing.span))
        return carrier.get("traceparent", "")

    def submit_carried(
        self,
        servable: Any,
        item: Any,
        *,
        deadline: float | None,
        traceparent: str,
        name: str,
        route: str | None = None,
    ) -> Awaitable[Any]:
        """Submit ``item`` to ``servable`` under a span ``name``, a child of the
        ``traceparent`` another process carried along (its stage spans and batch
        links as an HTTP request's); a plain submit without one, or when the
        servable's ``submit`` takes no ``timing``."""
        if not traceparent or not accepts_timing(servable):
            return servable.submit(item, deadline=deadline, route=route)  # type: ignore[no-any-return]
        timing = Timing(time.monotonic(), told=False)
        self.start_request(timing, name, ((b"traceparent", traceparent.encode("latin-1")),))
        submitted = servable.submit(item, deadline=deadline, route=route, timing=timing)
        return self.traced(submitted, timing)

    async def traced(self, submitted: Awaitable[Any], timing: Timing) -> Any:
        """``submitted``'s result; ``timing``'s request span ends with it (or its error)."""
        try:
            result = await submitted
        except BaseException as error:
            self.end_request(timing, error)
            raise
        self.end_request(timing, None)
        return result

    def end_request(self, timing: Timing, error: BaseException | None) -> None:
        """End ``timing``'s request span (with the error, if the request failed)."""
        span = timing.span
        if span is None:
            return
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()

    def stream_span(self, path: str, headers: Sequence[tuple[bytes, bytes]]) -> TracedStream:
        """A span for one stream over HTTP (``POST <path>``): see :meth:`named_stream_span`."""
        return self.named_stream_span("POST " + path, headers)

    def named_stream_span(self, name: str, headers: Sequence[tuple[bytes, bytes]]) -> TracedStream:
        """A span ``name`` for one stream, a child of the ``traceparent`` in
        ``headers``, started now; :meth:`TracedStream.open` opens the stream under it."""
        timing = Timing(time.monotonic(), told=False)
        self.start_request(timing, name, headers)
        return TracedStream(self, timing)

    def batch(
        self,
        stage: str,
        started_s: float,
        finished_s: float,
        size: int,
        cost: float | None,
        requests: Sequence[tuple[Timing, float]],
    ) -> None:
        """One batch's span, linked to the request span of each traced item in it,
        and each item's stage span (a child of its request span, linked to the batch).

        Args:
            stage: The stage's name.
            started_s: When the model started (``time.monotonic()``).
            finished_s: When it finished.
            size: The batch's size in batch units.
            cost: Its cost, when the stage has a ``cost_fn``.
            requests: Each traced item's record and when it arrived in the queue.
        """
        offset = _offset_ns()
        links = [Link(t.span.get_span_context()) for t, _ in requests if t.span is not None]
        attributes: dict[str, Any] = {"microbatch.stage": stage, "microbatch.batch.size": size}
        if cost is not None:
            attributes["microbatch.batch.cost"] = cost
        batch = self._tracer.start_span(
            f"batch {stage}",
            context=trace.set_span_in_context(trace.INVALID_SPAN),  # a root of its own
            links=links,
            attributes=attributes,
            start_time=_epoch_ns(started_s, offset),
        )
        batch.end(end_time=_epoch_ns(finished_s, offset))
        batch_link = [Link(batch.get_span_context())]
        for timing, arrived_s in requests:
            entry = timing.stages[-1]
            span = self._tracer.start_span(
                entry.stage,
                context=trace.set_span_in_context(timing.span),
                links=batch_link,
                attributes={
                    "microbatch.queued_ms": entry.queued_s * 1e3,
                    "microbatch.behind_ms": entry.behind_s * 1e3,
                    "microbatch.model_ms": entry.model_s * 1e3,
                    "microbatch.batch.size": size,
                },
                start_time=_epoch_ns(arrived_s, offset),
            )
            span.end(end_time=_epoch_ns(finished_s, offset))

    def step(
        self,
        loop: str,
        started_s: float,
        finished_s: float,
        size: int,
        joined: int,
        streams: Sequence[Timing],
    ) -> None:
        """One step's span (of step-wise batching), linked to the span of each traced
        stream it stepped: the fan-in of one step serving many streams, as
        :meth:`batch` for a batch.

        Args:
            loop: The step loop's name (e.g. ``stage 'generate'``).
            started_s: When the step started (``time.monotonic()``).
            finished_s: When it was done.
            size: The streams stepped (or that failed to join).
            joined: How many of them joined at this step.
            streams: The traced streams' records among them.
        """
        offset = _offset_ns()
        span = self._tracer.start_span(
            f"step of {loop}",
            context=trace.set_span_in_context(trace.INVALID_SPAN),  # a root of its own
            links=[Link(t.span.get_span_context()) for t in streams],
            attributes={
                "microbatch.step_loop": loop,
                "microbatch.step.size": size,
                "microbatch.step.joined": joined,
            },
            start_time=_epoch_ns(started_s, offset),
        )
        span.end(end_time=_epoch_ns(finished_s, offset))


class TracedStream:
    """One stream's span around its chunks: an event at the first chunk (with the
    wait for it: queued, then the first step), the number of chunks, and the end
    (complete, the stream's error, or ``client_left`` when the reader closed it
    early). The chunks pass through as they are, ``take_ready`` and ``aclose`` too.
    While the stream is opened (and while a chunk is awaited: a pipeline opens its
    step-wise stage's stream later), its record is the current
    :data:`~microbatch._batch_timing.traced_stream`, so that the steps that serve it
    link to its span (:meth:`Tracer.step`).

    Args:
        tracer: The tracer whose span it is.
        timing: The record holding the stream's span (started).
    """

    def __init__(self, tracer: Tracer, timing: Timing) -> None:
        self._tracer = tracer
        self._timing = timing
        self._chunks: AsyncIterator[Any] | None = None
        self._count = 0
        self._ended = False

    def open(self, stream: Callable[..., AsyncIterator[Any]], *args: Any, **options: Any) -> Any:
        """``stream(*args, **options)`` under the span; the span ends with the
        stream's error when opening it raises (refused: overload, shutdown)."""
        token = traced_stream.set(self._timing)
        try:
            self._chunks = stream(*args, **options)
        except BaseException as error:
            self._end(error)
            raise
        finally:
            traced_stream.reset(token)
        return self

    def __aiter__(self) -> TracedStream:
        return self

    async def __anext__(self) -> Any:
        assert self._chunks is not None
        token = traced_stream.set(self._timing)
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._end(None)
            raise
        except BaseException as error:
            self._end(error)
            raise
        finally:
            traced_stream.reset(token)
        self._counted(1)
        return chunk

    def take_ready(self) -> list[Any]:
        """The chunks that are there already (see the streams' ``take_ready``)."""
        take = getattr(self._chunks, "take_ready", None)
        ready: list[Any] = [] if take is None else take()
        self._counted(len(ready))
        return ready

    async def aclose(self) -> None:
        """Close the stream (the reader is done with it)."""
        try:
            if self._chunks is not None:
                await stop_reading(self._chunks)
        finally:
            if not self._ended:
                self._timing.span.set_attribute("microbatch.stream.client_left", True)
            self._end(None)

    def _counted(self, chunks: int) -> None:
        if chunks and not self._count:
            waited = time.monotonic() - self._timing.start_s
            self._timing.span.add_event("first chunk", {"microbatch.first_chunk_ms": waited * 1e3})
        self._count += chunks

    def _end(self, error: BaseException | None) -> None:
        if self._ended:
            return
        self._ended = True
        span = self._timing.span
        span.set_attribute("microbatch.stream.chunks", self._count)
        if isinstance(error, asyncio.CancelledError):  # the reader went away
            span.set_attribute("microbatch.stream.client_left", True)
            error = None
        self._tracer.end_request(self._timing, error)


def configure(environ: dict[str, str] | None = None) -> Tracer:
    """A :class:`Tracer` for ``microbatch serve --otel``: when no tracer provider is
    set yet, one from the OpenTelemetry SDK exporting as ``OTEL_TRACES_EXPORTER``
    says (``otlp`` needs ``opentelemetry-exporter-otlp``; ``console``, the default,
    writes each span as JSON to stderr).

    Raises:
        RuntimeError: OpenTelemetry (API or SDK) is not installed.
    """
    if trace is None:
        raise RuntimeError("--otel needs OpenTelemetry: pip install 'microbatch[otel]'")
    env = os.environ if environ is None else environ
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import (
                BatchSpanProcessor,
                ConsoleSpanExporter,
                SpanExporter,
            )
        except ImportError as missing:
            raise RuntimeError("--otel needs the OpenTelemetry SDK: microbatch[otel]") from missing
        exporter: SpanExporter
        if env.get("OTEL_TRACES_EXPORTER", "console") == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )

            exporter = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter(out=sys.stderr)
        name = env.get("OTEL_SERVICE_NAME", "microbatch")
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    return Tracer()
