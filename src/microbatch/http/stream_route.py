"""``POST /stream`` (and ``/stream/{route}``, and a predict path asked for a stream)
without a transport: what the ASGI app and ``microbatch serve``'s own connection
layer both call, as :class:`~.predict.Predictor` is for one answer.

A stream is taken in two steps, so that a server can refuse it before reading its
body: :meth:`StreamRoute.check` reads the headers the route needs and works out the
deadlines and the framing once; :meth:`StreamRoute.open` decodes the body and opens
the servable's stream (under a span of its own when traced).

What the connection layer asks of every stream route it answers itself is
:class:`NativeStreamRoute`: this one, and the OpenAI completion routes'
(:mod:`.completion_stream`), which leave some requests to the ASGI app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple, Protocol

from ..types import StreamingServable, deadline_from
from .codecs import Decoder
from .predict import (
    BodyRoute,
    ErrorAnswer,
    HeaderMap,
    RawHeaders,
    RouteSettings,
    check_body_length,
    remembered_decoder,
)
from .streams import (
    FIRST_CHUNK_TIMEOUT_HEADER,
    Framing,
    first_chunk_timeout_from,
    framing_for_accept,
)

__all__ = ["NativeStreamRoute", "OpenedStream", "StreamRequest", "StreamRoute"]


class StreamRequest(NamedTuple):
    """A stream request whose headers passed: its deadlines, framing and body decoder."""

    deadline: float | None
    first_chunk_deadline: float | None
    framing: Framing
    decode: Decoder


class OpenedStream(NamedTuple):
    """A stream opened for a request: its chunks, and how each is written."""

    chunks: AsyncIterator[Any]
    framing: Framing


class NativeStreamRoute(Protocol):
    """A stream route as ``microbatch serve``'s connection layer answers it, without
    ASGI: checked from the headers, opened from the whole body, its chunks written
    as its framing says, its errors answered as it says. Where it gives None, the
    request goes to the app's ASGI route instead (its body handed on whole)."""

    label: str
    max_body_bytes: int
    tells: bool
    request_id: Callable[[bytes | None], str]

    def check(self, headers: HeaderMap) -> object | None:
        """What the headers decide (None: the ASGI route takes the request).

        Raises:
            Exception: A header refuses the request (answered by :meth:`error_answer`).
        """

    def open(self, checked: Any, body: bytes, headers: RawHeaders) -> OpenedStream | None:
        """Open the stream of the request ``check`` passed (None: the ASGI route
        takes the request, and its body).

        Raises:
            Exception: The request or its servable refused it (answered by
                :meth:`error_answer`).
        """

    def error_answer(self, error: Exception, accept: bytes | None, request_id: str) -> ErrorAnswer:
        """How this route answers ``error``."""


class StreamRoute(BodyRoute):
    """One stream route of an app, transport-neutral.

    Args:
        servable: The served model.
        settings: The route's (its label: ``/stream``, or ``/predict`` asked for a
            stream; its ``server_timing``: a stream's head tells the wait for its
            first chunk, an error's what is known; its tracer: a span per stream).
    """

    __slots__ = ("_servable",)

    def __init__(self, servable: StreamingServable[Any, Any], settings: RouteSettings) -> None:
        super().__init__(settings)
        self._servable = servable

    def check(self, headers: HeaderMap, *, authorize: bool = True) -> StreamRequest:
        """Everything about a stream request that its headers decide, before its body
        is read (in the order the errors are told).

        Args:
            headers: The request's headers by name (see :data:`~.predict.HeaderMap`).
            authorize: Check the bearer token here (False where the caller did).

        Raises:
            Unauthorized: The token is required and missing or wrong (401).
            NotReady: The app is draining (503).
            BadRequest: ``X-Request-Timeout-Ms``, ``X-First-Chunk-Timeout-Ms`` or
                ``Content-Length`` is not valid (400).
            NotAcceptable: ``Accept`` names no stream framing (406).
            UnsupportedMediaType: ``Content-Type`` is neither JSON nor msgpack (415).
            BodyTooLarge: ``Content-Length`` is over the limit (413).
        """
        get = headers.get
        deadline = self._deadline(get, authorize)
        first_timeout = first_chunk_timeout_from(get(FIRST_CHUNK_TIMEOUT_HEADER))
        first_chunk_deadline = deadline_from(first_timeout, deadline)
        framing = framing_for_accept(get(b"accept"))
        decode = remembered_decoder(self._by_content_type, self._decoders, get(b"content-type"))
        check_body_length(get(b"content-length"), self.max_body_bytes)
        return StreamRequest(deadline, first_chunk_deadline, framing, decode)

    def open(self, request: StreamRequest, body: bytes, headers: RawHeaders) -> OpenedStream:
        """Decode the body (4xx here, before any queue) and open the item's stream.

        Raises:
            msgspec.DecodeError: The body is malformed (400).
            msgspec.ValidationError: It does not match the input type (422).
            Exception: The servable refused the stream (overload: 503, ...).
        """
        item = request.decode(body)
        stream = self._servable.stream
        chunks: AsyncIterator[Any]
        if self._tracer is not None:  # a span per stream
            traced = self._tracer.stream_span(self.label, headers)
            chunks = traced.open(
                stream,
                item,
                deadline=request.deadline,
                route=self.route,
                first_chunk_deadline=request.first_chunk_deadline,
            )
        else:
            chunks = stream(
                item,
                deadline=request.deadline,
                route=self.route,
                first_chunk_deadline=request.first_chunk_deadline,
            )
        return OpenedStream(chunks, request.framing)
