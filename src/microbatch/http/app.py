"""The ASGI app: ``POST /predict`` into a Service or batched function, health probes,
metrics and the OpenAPI document.

A plain ASGI 3 callable (no web framework): a handful of fixed routes do not need one.
The service is started and closed through the ASGI lifespan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from .. import __version__
from ..inference import InferenceModel
from ..loading import as_servable
from ..logs import current_request_id

if TYPE_CHECKING:
    from ..tracing import Tracer
from ..types import Servable, StreamingServable
from . import request_body
from .access_log import log_access, log_access_line
from .asgi import Receive, Scope, Send, header, send_response
from .bearer import authorize, expected_authorization
from .codecs import CODECS, JSON, Decoder
from .completion_stream import CompletionStream
from .completions import CHAT_PATH, COMPLETIONS_PATH, text_generators
from .config import HttpConfig
from .error_log import RepeatedErrorLog
from .generate import GENERATE_EXTENSION, generate_routes
from .inference_v2 import v2_routes
from .metrics import HttpMetrics
from .openai_routes import openai_routes
from .predict import (
    TIMEOUT_HEADER,
    Predictor,
    RouteSettings,
    encode_result,
    error_response,
    timeout_from_header,
)
from .request_id import REQUEST_ID_HEADER, RequestIds, echo_request_id
from .routing import CLIENT_CLOSED, ClientGone, Handler, RouteTable, until_disconnect
from .schema import add_protocol_operations, docs_page, openapi_document
from .server_timing import ResponseTiming, forget, note_error, noted, tell_timing
from .status import MethodNotAllowed, NotFound, NotReady, error_reply
from .stream_route import NativeStreamRoute, StreamRoute
from .streams import add_stream_operations, send_stream, wants_stream

__all__ = ["HttpApp", "HttpConfig", "app"]

logger = logging.getLogger("microbatch.http")


class HttpApp:
    """An ASGI app serving one :class:`~microbatch.types.Servable`.

    Args:
        servable: The served model: a Service, a batched function, or anything else
            that speaks the contract (see :func:`app`).
        config: Limits, timeouts and the bearer token.
        tracer: Trace predict requests with this :class:`~microbatch.tracing.Tracer`
            (default: one on the global provider when ``config.tracing``).
    """

    def __init__(
        self,
        servable: Servable[Any, Any],
        config: HttpConfig | None = None,
        *,
        tracer: Tracer | None = None,
    ) -> None:
        self.servable = servable
        target = servable
        self.config = config if config is not None else HttpConfig()
        if tracer is None and self.config.tracing:
            from ..tracing import configure  # imports OpenTelemetry: only here

            tracer = configure()
        self.tracer = tracer
        self.metrics = HttpMetrics(target.stats)
        tally = self.metrics.requests.tally
        if self.config.access_log:
            tally.access_log = log_access_line
        self.record = tally.answered
        """Count (and access-log) one request that a server answered without ASGI (see
        :meth:`native_predictors`): ``record(route, status, seconds, request_id,
        client)``. Compiled, with no Python call per request (``request_tally.py``)."""
        self.openapi = openapi_document(
            self.config.api_title or target.name,
            self.config.api_version or __version__,
            target.input_type,
            target.output_type,
            auth=self.config.auth_token is not None,
            routes=target.routes,
            examples=target.examples,
        )
        self._streaming = _streaming(target)
        stream_routes: list[str | None] = []
        if self._streaming is not None:
            every: list[str | None] = [None, *target.routes]
            stream_routes = [r for r in every if self._streaming.can_stream(r)]
            add_stream_operations(
                self.openapi, {_stream_path(r): _predict_path(r) for r in stream_routes}
            )
        self._decoders = _decoders(target.input_type)
        self._expected_authorization = expected_authorization(self.config.auth_token)
        self._draining = False
        self._not_ready = False
        self._request_ids = RequestIds()
        self._errors = RepeatedErrorLog(logger)
        self._routes: RouteTable = {
            "/predict": ("POST", self._predict, True),
            "/health/live": ("GET", self._live, False),
            "/health/ready": ("GET", self._ready, False),
            "/metrics": ("GET", self._metrics, True),
            "/openapi.json": ("GET", self._openapi, True),
            "/docs": ("GET", self._docs, True),
        }
        for route, (input_type, _) in target.routes.items():
            handler = partial(self._predict, route=route, decoders=_decoders(input_type))
            self._routes[f"/predict/{route}"] = ("POST", handler, True)
        # A stream route per stream path, and per predict path that streams when asked.
        self._stream_routes: dict[str, StreamRoute] = {}
        for stage_route in stream_routes:  # POST /stream: the chunks as they come
            decoders = (
                self._decoders if stage_route is None else _decoders(target.routes[stage_route][0])
            )
            for path in (_stream_path(stage_route), _predict_path(stage_route)):
                self._stream_routes[path] = self._stream_route(stage_route, decoders, path)
            handler = partial(self._stream, path=_stream_path(stage_route))
            self._routes[_stream_path(stage_route)] = ("POST", handler, True)
        v2_models = {target.name: InferenceModel(target)}
        self._routes.update(v2_routes(self, v2_models, extensions=[GENERATE_EXTENSION]))
        self._routes.update(generate_routes(self, v2_models))
        openai = openai_routes(self, {target.name: target})
        self._routes.update(openai)
        # The completion routes' streams, as the connection layer answers them (while
        # the route table keeps the handler made here).
        self._completion_streams: dict[str, tuple[Handler, CompletionStream]] = {}
        if COMPLETIONS_PATH in openai:
            generators = text_generators({target.name: target})
            for path in (COMPLETIONS_PATH, CHAT_PATH):
                settings = self._route_settings(None, {}, path)
                self._completion_streams[path] = (
                    openai[path][1],
                    CompletionStream(generators, path, settings),
                )
        add_protocol_operations(
            self.openapi,
            v2_models=[target.name],
            embeddings="/v1/embeddings" in openai,
            completions="/v1/completions" in openai,
            auth=self.config.auth_token is not None,
        )
        self._openapi_body = msgspec.json.encode(self.openapi)
        self._docs_body = docs_page(self.openapi)
        self._predictors = {
            "/predict": self._predictor(None, self._decoders),
            **{
                f"/predict/{route}": self._predictor(route, _decoders(input_type))
                for route, (input_type, _) in target.routes.items()
            },
        }

    def _predictor(self, route: str | None, decoders: dict[str, Decoder]) -> Predictor:
        return Predictor(self.servable, self._route_settings(route, decoders, _predict_path(route)))

    def _stream_route(
        self, route: str | None, decoders: dict[str, Decoder], label: str
    ) -> StreamRoute:
        assert self._streaming is not None
        return StreamRoute(self._streaming, self._route_settings(route, decoders, label))

    def _route_settings(
        self, route: str | None, decoders: dict[str, Decoder], label: str
    ) -> RouteSettings:
        return RouteSettings(
            self,
            route,
            decoders,
            self.config.default_timeout_s,
            self.config.max_body_bytes,
            self._expected_authorization,
            label,
            self._request_ids.for_request,
            self._errors.failed,
            self.config.server_timing,
            self.tracer,
        )

    def native_predictors(self) -> dict[str, Predictor]:
        """The predict routes a server may call without ASGI (see :mod:`.predict`),
        by path: those whose entry in the route table is still the app's own (one
        with a stream form streams when ``Accept`` asks: see :meth:`native_streams`)."""
        return {
            path: predictor
            for path, predictor in self._predictors.items()
            if path in self._routes and _same_handler(self._routes[path][1], self)
        }

    def native_streams(self) -> dict[str, NativeStreamRoute]:
        """The stream routes a server may call without ASGI (see :mod:`.stream_route`),
        by path: each ``/stream`` path whose entry in the route table is still the
        app's own, each native predict path with a stream form (taken when ``Accept``
        asks for a stream, see :func:`~.streams.wants_stream`), and the OpenAI
        completion routes, for their streamed answers (:mod:`.completion_stream`)."""
        predictors = self.native_predictors()
        routes: dict[str, NativeStreamRoute] = {
            path: route
            for path, route in self._stream_routes.items()
            if path in predictors
            or (path in self._routes and _same_handler(self._routes[path][1], self))
        }
        for path, (handler, route) in self._completion_streams.items():
            if path in self._routes and self._routes[path][1] is handler:
                routes[path] = route
        return routes

    @property
    def draining(self) -> bool:
        """Shutdown has begun: readiness answers 503 and no new item is taken."""
        return self._draining

    def begin_draining(self) -> None:
        """Turn readiness to 503 and refuse new items at once (the server calls this on
        SIGTERM, before it stops accepting connections and waits for in-flight ones)."""
        self._draining = True

    def stop_being_ready(self) -> None:
        """Turn readiness to 503 while requests are still served: the drain delay
        before :meth:`begin_draining`, while a load balancer stops sending traffic."""
        self._not_ready = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI 3 entry point: HTTP requests and the lifespan."""
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            raise ValueError(f"microbatch's HTTP app does not serve {kind!r} connections")

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request_id = self._request_ids.for_request(header(scope, REQUEST_ID_HEADER))
        context = current_request_id.set(request_id)
        send = echo_request_id(send, request_id)
        timing_token = None
        if self.config.server_timing:  # on every response: what is known of it
            send, timing_token = tell_timing(send, ResponseTiming(time.monotonic()))
        path = scope["path"]
        route = self._routes.get(path)
        label = path if route is not None else "other"
        try:
            if route is None:
                raise NotFound(f"no route {path!r}; see /docs")
            method, handler, protected = route
            if scope["method"] != method:
                raise MethodNotAllowed(f"{path} takes {method}", allow=method)
            if protected and self._expected_authorization is not None:
                authorize(scope, self._expected_authorization)
            status = await handler(scope, receive, send)
        except (request_body.ClientDisconnected, ClientGone):
            status = CLIENT_CLOSED
        except Exception as error:
            status = await self._send_error(scope, send, error, request_id)
        seconds = time.perf_counter() - started
        self.metrics.record(label, status, seconds)
        if self.config.access_log:
            log_access(scope, status, seconds, request_id)
        if timing_token is not None:
            forget(timing_token)
        current_request_id.reset(context)

    async def _send_error(self, scope: Scope, send: Send, error: Exception, request_id: str) -> int:
        status, body, media_type, headers = error_response(
            error, header(scope, b"accept"), request_id, self._errors.failed
        )
        note_error(error_reply(error).error)
        await send_response(send, status, body, media_type, headers)
        return status

    # -- routes ------------------------------------------------------------------

    async def _predict(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: str | None = None,
        decoders: dict[str, Decoder] | None = None,
    ) -> int:
        accept = header(scope, b"accept")
        if wants_stream(accept) and _stream_path(route) in self._routes:
            return await self._stream(scope, receive, send, _predict_path(route))
        predictor = self._predictors[_predict_path(route)]
        checked = predictor.check(dict(scope["headers"]), authorize=False)
        item = checked.decode(await self.read_body(scope, receive))
        timing = predictor.timing(scope["headers"])
        told = noted()
        if told is not None:  # its Server-Timing, failed or not (see tell_timing)
            told.timing = timing
        submitted = predictor.submit_item(item, checked.deadline, timing)
        result = await until_disconnect(scope, receive, _awaited(submitted))
        body = encode_result(checked.encoder, result)
        await send_response(send, 200, body, checked.encoder.media_type)
        return 200

    async def _stream(self, scope: Scope, receive: Receive, send: Send, path: str) -> int:
        """``POST /stream`` (or a predict path asked for a stream): the item's chunks
        as SSE, NDJSON or msgpack messages (see ``http/streams.py``); errors before
        the first chunk are plain errors."""
        route = self._stream_routes[path]
        request = route.check(dict(scope["headers"]), authorize=False)
        told = noted()
        if told is not None:  # its head tells the wait for the first chunk
            told.stream = True
        body = await self.read_body(scope, receive)
        opened = route.open(request, body, scope["headers"])
        return await send_stream(scope, receive, send, opened.chunks, opened.framing)

    async def _live(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, b'{"status":"live"}', JSON.media_type)
        return 200

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> int:
        if self._draining or self._not_ready:
            raise NotReady("the server is shutting down")
        if not self.servable.ready:
            raise NotReady("the service is not ready")
        await send_response(send, 200, b'{"status":"ready"}', JSON.media_type)
        return 200

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, self.metrics.render(), self.metrics.content_type)
        return 200

    async def _openapi(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, self._openapi_body, JSON.media_type)
        return 200

    async def _docs(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, self._docs_body, b"text/html; charset=utf-8")
        return 200

    # -- what the protocol routes use (routing.RouteHost) -----------------------------

    def timeout_s(self, scope: Scope) -> float:
        """The request's timeout: the default, lowered by ``X-Request-Timeout-Ms``."""
        return timeout_from_header(header(scope, TIMEOUT_HEADER), self.config.default_timeout_s)

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, under the size and time limits (413, 408 past them)."""
        config = self.config
        limit, timeout_s = config.max_body_bytes, config.body_timeout_s
        return await request_body.read_body(scope, receive, limit, timeout_s)

    # -- lifespan ----------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.servable.start()
                except Exception as error:
                    logger.exception("the service failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(error)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self._draining = True
                self._errors.flush()
                try:
                    await self.servable.close()
                except Exception as error:
                    logger.exception("the service failed to close")
                    await send({"type": "lifespan.shutdown.failed", "message": str(error)})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return


def _stream_path(route: str | None) -> str:
    """The path of the stream route of ``route`` (None: the whole model)."""
    return "/stream" if route is None else f"/stream/{route}"


def _predict_path(route: str | None) -> str:
    """The path of the predict route of ``route`` (None: the whole model)."""
    return "/predict" if route is None else f"/predict/{route}"


def _streaming(servable: Servable[Any, Any]) -> StreamingServable[Any, Any] | None:
    """``servable`` if it can stream for some route, else None."""
    if not isinstance(servable, StreamingServable):
        return None
    routes: list[str | None] = [None, *servable.routes]
    if any(servable.can_stream(route) for route in routes):
        return servable
    return None


def _decoders(item_type: Any) -> dict[str, Decoder]:
    """A decoder (and validator) of ``item_type`` per codec name."""
    return {codec.name: codec.make_decoder(item_type) for codec in CODECS}


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    """``awaitable``'s result, as a coroutine (:func:`.routing.until_disconnect` needs one)."""
    return await awaitable


def _same_handler(handler: Handler, app: HttpApp) -> bool:
    """Whether ``handler`` is the app's own predict or stream handler (not replaced since)."""
    own = (app._predict, app._stream)
    return handler in own or getattr(handler, "func", None) in own


def app(
    served: object,
    *,
    max_body_bytes: int = 10 * 1024 * 1024,
    default_timeout_s: float = 30.0,
    body_timeout_s: float = 30.0,
    auth_token: str | None = None,
) -> HttpApp:
    """An ASGI app serving a :class:`~microbatch.Service` or a ``@microbatch.batch``
    function; it starts and closes the service through the ASGI lifespan.

    Args:
        served: The Service or batched function.
        max_body_bytes: Largest request body (413 above it).
        default_timeout_s: Each request's deadline (504 past it).
        body_timeout_s: Longest time to receive a body (408 past it).
        auth_token: When set, bearer token required on every non-probe route (401).

    Raises:
        TypeError: ``served`` is neither a Service nor a batched function.
        ValueError: A setting is out of range.
    """
    config = HttpConfig(max_body_bytes, default_timeout_s, body_timeout_s, auth_token)
    return HttpApp(as_servable(served), config)
