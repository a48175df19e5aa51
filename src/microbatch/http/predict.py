"""``POST /predict`` and ``POST /predict/{route}`` without a transport: what the ASGI
app and ``microbatch serve``'s own connection layer both call.

A request is taken in two steps, so that a server can refuse it before reading its
body: :meth:`Predictor.check` reads the headers the route needs (bearer token,
``Content-Type``, ``Accept``, ``X-Request-Timeout-Ms``, ``Content-Length``) and
works the deadline out once; :meth:`Predictor.submit` decodes the body straight from
its bytes and hands the item to the servable. Errors become responses through
:func:`error_response`, the one place both transports render them.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..timing import Timing, accepts_timing
from ..types import Servable, deadline_from
from .codecs import JSON, Codec, Decoder, codec_for_accept, codec_for_content_type
from .status import (
    BadRequest,
    BodyTooLarge,
    ErrorBody,
    NotReady,
    Unauthorized,
    UnencodableResult,
    error_reply,
)

if TYPE_CHECKING:
    from ..tracing import Tracer

__all__ = [
    "TIMEOUT_HEADER",
    "BodyRoute",
    "Checked",
    "DrainState",
    "ErrorAnswer",
    "HeaderMap",
    "Predictor",
    "RouteSettings",
    "check_bearer",
    "check_body_length",
    "content_length",
    "encode_result",
    "error_response",
    "remembered_decoder",
    "request_deadline",
    "timeout_from_header",
]

logger = logging.getLogger("microbatch.http")

TIMEOUT_HEADER = b"x-request-timeout-ms"
"""A client lowers its request's deadline with this header (milliseconds)."""

RawHeaders = Sequence[tuple[bytes, bytes]]
"""A request's headers as they came: (name in lower case, value) pairs."""

HeaderMap = Mapping[bytes, bytes]
"""A request's headers by name (in lower case); a name sent twice has its last value."""


class DrainState(Protocol):
    """What a predictor asks its app before taking an item: is it shutting down?"""

    @property
    def draining(self) -> bool:
        """Shutdown has begun: no new item is taken."""


class Checked:
    """A request whose headers passed: its deadline, body decoder and result codec.
    (A plain class: compiled, it is made without the Python call a NamedTuple's
    ``__new__`` costs on every request.)"""

    __slots__ = ("deadline", "decode", "encoder")

    def __init__(self, deadline: float | None, decode: Decoder, encoder: Codec) -> None:
        self.deadline = deadline
        self.decode = decode
        self.encoder = encoder


@dataclass(frozen=True, slots=True)
class RouteSettings:
    """What a route that reads a request's body is set with.

    Attributes:
        app: Whose draining state is read on every request.
        route: The servable's route name, or None for the whole servable.
        decoders: A body decoder per codec name, for the route's input type.
        default_timeout_s: A request's deadline from its arrival (a stream's: the
            whole stream).
        max_body_bytes: Largest body (413 above it).
        authorization: The exact ``Authorization`` value required, or None.
        label: The route's name in metrics (``/predict``, ``/predict/{route}``,
            ``/stream``, ...).
        request_id: The request's id from the client's ``X-Request-ID`` value (see
            :class:`~.request_id.RequestIds`).
        failed: Logs a server error under its request id (the app's
            :class:`~.error_log.RepeatedErrorLog`).
        server_timing: Answer with ``Server-Timing`` (errors too, see
            :func:`~microbatch.timing.failure_line`).
        tracer: Trace each request (see :mod:`microbatch.tracing`), or None.
    """

    app: DrainState
    route: str | None
    decoders: dict[str, Decoder]
    default_timeout_s: float
    max_body_bytes: int
    authorization: bytes | None
    label: str
    request_id: Callable[[bytes | None], str]
    failed: Callable[[str, BaseException], None]
    server_timing: bool = True
    tracer: Tracer | None = None


class BodyRoute:
    """What a route that reads a request's body holds, transport-neutral: its
    settings (as attributes, read on every request) and the decoders the
    ``Content-Type`` values seen so far chose (see :class:`Predictor` and
    :class:`~.stream_route.StreamRoute`)."""

    __slots__ = (
        "_app",
        "_authorization",
        "_by_content_type",
        "_decoders",
        "_default_timeout_s",
        "_tracer",
        "failed",
        "label",
        "max_body_bytes",
        "request_id",
        "route",
        "tells",
    )

    def __init__(self, settings: RouteSettings) -> None:
        self._app = settings.app
        self.route = settings.route
        self._decoders = settings.decoders
        self._default_timeout_s = settings.default_timeout_s
        self.max_body_bytes = settings.max_body_bytes
        self._authorization = settings.authorization
        self.label = settings.label
        self.request_id = settings.request_id
        self.failed = settings.failed
        self.tells = settings.server_timing
        self._tracer = settings.tracer
        # what the Content-Type values seen so far chose (a few, at most)
        self._by_content_type: dict[bytes | None, Decoder] = {}

    def _deadline(self, get: Callable[[bytes], bytes | None], authorize: bool) -> float | None:
        """The checks every body route makes first, in this order (401, 503, then 400
        for a bad ``X-Request-Timeout-Ms``); the request's deadline.

        Args:
            get: Looks a header up by its lower-case name.
            authorize: Check the bearer token here (False where the caller did).
        """
        if authorize:
            check_bearer(get(b"authorization"), self._authorization)
        if self._app.draining:
            raise NotReady("the server is shutting down")
        return request_deadline(get(TIMEOUT_HEADER), self._default_timeout_s)

    def error_answer(self, error: Exception, accept: bytes | None, request_id: str) -> ErrorAnswer:
        """How this route answers ``error`` (see :func:`error_response`)."""
        status, body, media_type, headers = error_response(error, accept, request_id, self.failed)
        return ErrorAnswer(status, body, media_type, headers, error_reply(error).error)


class Predictor(BodyRoute):
    """One predict route of an app, transport-neutral.

    Args:
        servable: The served model.
        settings: The route's.
    """

    __slots__ = ("_by_accept", "_submit", "_submit_nowait", "timed")

    def __init__(self, servable: Servable[Any, Any], settings: RouteSettings) -> None:
        super().__init__(settings)
        # Any: a servable's submit takes ``timing`` only where accepts_timing() says so
        self._submit: Callable[..., Awaitable[Any]] = servable.submit
        # A servable that can queue an item without a coroutine (a Service) spares
        # the front a task per request.
        self._submit_nowait: Callable[..., asyncio.Future[Any] | None] | None = getattr(
            servable, "submit_nowait", None
        )
        self.timed = (self.tells or self._tracer is not None) and accepts_timing(servable)
        """Whether a request gets a timing record (for ``Server-Timing`` or a trace)."""
        self._by_accept: dict[bytes | None, Codec] = {}  # what Accept values chose

    def check(self, headers: HeaderMap, *, authorize: bool = True) -> Checked:
        """Everything about a request that its headers decide, before its body is read.

        Args:
            headers: The request's headers by name (see :data:`HeaderMap`).
            authorize: Check the bearer token here (False where the caller did).

        Raises:
            Unauthorized: The token is required and missing or wrong (401).
            NotReady: The app is draining (503).
            BadRequest: ``X-Request-Timeout-Ms`` or ``Content-Length`` is not valid (400).
            BodyTooLarge: ``Content-Length`` is over the limit (413).
            UnsupportedMediaType: ``Content-Type`` is neither JSON nor msgpack (415).
            NotAcceptable: ``Accept`` names neither (406).
        """
        get = headers.get
        deadline = self._deadline(get, authorize)
        decode = remembered_decoder(self._by_content_type, self._decoders, get(b"content-type"))
        accept = get(b"accept")
        encoder = self._by_accept.get(accept)
        if encoder is None:
            encoder = codec_for_accept(accept)
            _remember(self._by_accept, accept, encoder)
        check_body_length(get(b"content-length"), self.max_body_bytes)
        return Checked(deadline, decode, encoder)

    def timing(self, headers: RawHeaders = (), start_s: float | None = None) -> Timing | None:
        """A new record for one request's ``Server-Timing`` and trace (its span
        started, a child of the ``traceparent`` in ``headers``), or None when this
        route does neither. ``start_s``: when the request came in
        (``time.monotonic()``), where the caller read it already; else now."""
        if not self.timed:
            return None
        timing = Timing(time.monotonic() if start_s is None else start_s)
        if self._tracer is not None:
            timing.told = self.tells
            self._tracer.start_request(timing, "POST " + self.label, headers)
        return timing

    def submit(self, checked: Checked, body: bytes, timing: Timing | None = None) -> Awaitable[Any]:
        """Decode the body (4xx here, before any queue) and submit the item (with
        ``timing``, from :meth:`timing`, for its ``Server-Timing``): an
        :class:`asyncio.Future` where the servable queued it at once (the caller adds
        a callback and cancels it if the client leaves), else an awaitable.

        Raises:
            msgspec.DecodeError: The body is malformed (400).
            msgspec.ValidationError: It does not match the input type (422).
        """
        item = checked.decode(body)
        nowait = self._submit_nowait
        if nowait is not None and (timing is None or timing.span is None):
            # queued at once, no coroutine (a traced request's span needs one)
            future = (
                nowait(item, deadline=checked.deadline, route=self.route)
                if timing is None
                else nowait(item, deadline=checked.deadline, route=self.route, timing=timing)
            )
            if future is not None:
                return future
        return self.submit_item(item, checked.deadline, timing)

    def submit_item(
        self, item: Any, deadline: float | None, timing: Timing | None = None
    ) -> Awaitable[Any]:
        """Submit a decoded item (``timing`` only where :attr:`timed`)."""
        if timing is None:
            return self._submit(item, deadline=deadline, route=self.route)
        submitted = self._submit(item, deadline=deadline, route=self.route, timing=timing)
        return submitted if timing.span is None else timing.tracer.traced(submitted, timing)


_REMEMBERED = 32


def _remember(cache: dict[bytes | None, Any], key: bytes | None, value: Any) -> None:
    """Keep ``value`` for ``key`` unless the cache is full (clients choose the keys)."""
    if len(cache) < _REMEMBERED:
        cache[key] = value


# -- what every route that reads a body checks in its headers (predict and stream) --


def check_bearer(given: bytes | None, expected: bytes | None) -> None:
    """Nothing when ``expected`` is None or ``given`` is it (compared in constant time).

    Raises:
        Unauthorized: The token is required and missing or wrong (401).
    """
    if expected is not None and not hmac.compare_digest(given or b"", expected):
        raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")


def request_deadline(timeout: bytes | None, default_timeout_s: float) -> float | None:
    """The request's deadline (``time.monotonic()``): ``default_timeout_s`` from now,
    lowered by its ``X-Request-Timeout-Ms`` value.

    Raises:
        BadRequest: The value is not a number of milliseconds > 0.
    """
    if timeout is None:
        return time.monotonic() + default_timeout_s
    return deadline_from(timeout_from_header(timeout, default_timeout_s))


def remembered_decoder(
    cache: dict[bytes | None, Decoder], decoders: dict[str, Decoder], content_type: bytes | None
) -> Decoder:
    """The body decoder ``Content-Type`` names, from ``cache`` when it was seen before.

    Raises:
        UnsupportedMediaType: ``Content-Type`` is neither JSON nor msgpack (415).
    """
    decode = cache.get(content_type)
    if decode is None:
        decode = decoders[codec_for_content_type(content_type).name]
        _remember(cache, content_type, decode)
    return decode


def check_body_length(length: bytes | None, limit: int) -> None:
    """Nothing when ``Content-Length`` is absent or within ``limit``.

    Raises:
        BadRequest: It is not a number (400).
        BodyTooLarge: It is over ``limit`` (413).
    """
    if length is None:
        return
    size = content_length(length)
    if size < 0:
        raise BadRequest("Content-Length is not a number")
    if size > limit:
        raise BodyTooLarge(f"the body has {size} bytes; the limit is {limit}")


def content_length(value: bytes) -> int:
    """A ``Content-Length`` value's number (as ``int()`` reads it), or -1 where it is
    not a number. Digits alone are read here: compiled, far cheaper than ``int()``."""
    if 0 < len(value) <= 18:
        size = 0
        for digit in value:
            if digit < 48 or digit > 57:
                break
            size = size * 10 + digit - 48
        else:
            return size
    try:
        return int(value)
    except ValueError:
        return -1


def timeout_from_header(given: bytes | None, default: float) -> float:
    """The request's timeout in seconds: ``default``, lowered by ``X-Request-Timeout-Ms``.

    Raises:
        BadRequest: The header is not a number of milliseconds > 0.
    """
    if given is None:
        return default
    try:
        milliseconds = float(given)
    except ValueError:
        milliseconds = math.nan
    if not 0 < milliseconds < math.inf:
        raise BadRequest("X-Request-Timeout-Ms must be a number of milliseconds > 0")
    return min(default, milliseconds / 1000.0)


def encode_result(codec: Codec, result: Any) -> bytes:
    """A result in the response's codec.

    Raises:
        UnencodableResult: The codec cannot carry it (500).
    """
    try:
        return codec.encode(result)
    except (TypeError, ValueError, NotImplementedError, OverflowError) as error:
        raise UnencodableResult(
            f"the result ({type(result).__name__}) cannot be encoded as {codec.name}"
        ) from error


class ErrorAnswer(NamedTuple):
    """An error as a route answers it: status, body, media type, extra headers, and
    the name ``Server-Timing`` gives the failure."""

    status: int
    body: bytes
    media_type: bytes
    headers: list[tuple[bytes, bytes]]
    name: str


def error_response(
    error: Exception,
    accept: bytes | None,
    request_id: str,
    failed: Callable[[str, BaseException], None],
) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
    """An error as a response: status, body, media type and extra headers. Server
    errors (500s other than 503 and 504) go to ``failed`` (the app's
    :class:`~.error_log.RepeatedErrorLog`) under the request id the body carries."""
    reply = error_reply(error)
    if reply.status >= 500 and reply.status not in (503, 504):
        failed(request_id, error)
    try:
        codec = codec_for_accept(accept)
    except Exception:
        codec = JSON
    body = codec.encode(ErrorBody(reply.error, reply.message, request_id))
    return reply.status, body, codec.media_type, reply.headers
