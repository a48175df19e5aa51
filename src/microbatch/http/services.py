"""Several services in one ASGI app, each under its own name.

``Services([embed, classify], config)`` serves:

* ``/{name}/...``: each service's own :class:`~microbatch.http.HttpApp` (its
  ``/predict``, ``/predict/{route}``, ``/health/ready``, ``/metrics``,
  ``/openapi.json`` and ``/docs``), the path less its ``/{name}`` prefix;
* ``/v2/...``: the Open Inference Protocol v2 for every service
  (``/v2/models/{name}/...``, with Triton's generate extension: see
  :mod:`.generate`);
* ``/v1/embeddings`` for the services that declare an
  :class:`~microbatch.http.EmbeddingModel`, ``/v1/completions`` and
  ``/v1/chat/completions`` for those that declare a
  :class:`~microbatch.http.CompletionModel` (the request's ``model`` picks one), and
  ``/v1/models`` listing them;
* ``/health/live``, and ``/health/ready``: 200 when every service is ready;
* ``/metrics``: every service's metrics with a ``service`` label (the shared routes'
  requests with ``service="*"``), the process's own once.

One service is served by its own ``HttpApp`` instead (``/predict`` as ever).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from ..inference import InferenceModel
from ..types import Servable
from .app import HttpApp
from .asgi import Receive, Scope, Send, send_response
from .bearer import authorize, expected_authorization
from .codecs import JSON
from .config import HttpConfig
from .generate import GENERATE_EXTENSION, generate_routes
from .inference_v2 import v2_routes
from .openai_routes import openai_routes
from .predict import Predictor
from .request_body import ClientDisconnected
from .routing import CLIENT_CLOSED, RouteTable
from .server_timing import ResponseTiming, forget, note_error, tell_timing
from .service_metrics import ServicesMetrics
from .status import ErrorBody, MethodNotAllowed, NotFound, NotReady, error_reply
from .stream_route import NativeStreamRoute

__all__ = ["Services"]

logger = logging.getLogger("microbatch.http")


class Services:
    """An ASGI app serving several servables, each under its name (see the module).

    Args:
        servables: The services; their names must differ.
        config: Limits, timeouts and the bearer token, for every route.

    Raises:
        ValueError: No servable, or two with the same name.
    """

    def __init__(self, servables: Sequence[Servable[Any, Any]], config: HttpConfig) -> None:
        if not servables:
            raise ValueError("Services needs at least one servable")
        names = [servable.name for servable in servables]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"two services are named {twice[0]!r}; give each its own name")
        self.config = config
        self.apps = {servable.name: HttpApp(servable, config) for servable in servables}
        self._first = next(iter(self.apps.values()))
        self._draining = False
        self._not_ready = False
        self._expected_authorization = expected_authorization(config.auth_token)
        models = {name: InferenceModel(app.servable) for name, app in self.apps.items()}
        self.metrics = ServicesMetrics({name: app.metrics for name, app in self.apps.items()})
        self._routes: RouteTable = {
            "/health/live": ("GET", self._live, False),
            "/health/ready": ("GET", self._ready, False),
            "/metrics": ("GET", self._metrics, True),
            **v2_routes(self, models, extensions=[GENERATE_EXTENSION]),
            **generate_routes(self, models),
            **openai_routes(self, {name: app.servable for name, app in self.apps.items()}),
        }

    def native_predictors(self) -> dict[str, Predictor]:
        """None: every route of several services goes through ASGI (``/{name}/...``)."""
        return {}

    def native_streams(self) -> dict[str, NativeStreamRoute]:
        """None, as :meth:`native_predictors`."""
        return {}

    def record(self, route: str, status: int, seconds: float, request_id: str, client: str) -> None:
        """Never called: no route is answered without ASGI (see :meth:`native_predictors`)."""

    @property
    def draining(self) -> bool:
        """Shutdown has begun."""
        return self._draining

    def stop_being_ready(self) -> None:
        """Turn every readiness to 503 while requests are still served (the drain
        delay)."""
        self._not_ready = True
        for app in self.apps.values():
            app.stop_being_ready()

    def begin_draining(self) -> None:
        """Turn every readiness to 503 and refuse new items."""
        self._draining = True
        for app in self.apps.values():
            app.begin_draining()

    def timeout_s(self, scope: Scope) -> float:
        """The request's timeout: the default, lowered by ``X-Request-Timeout-Ms``."""
        return self._first.timeout_s(scope)

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, under the size and time limits."""
        return await self._first.read_body(scope, receive)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI 3 entry point."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise ValueError(f"microbatch's HTTP app does not serve {scope['type']!r} connections")
        path: str = scope["path"]
        route = self._routes.get(path)
        if route is None:
            name, _, rest = path[1:].partition("/")
            app = self.apps.get(name)
            if app is not None and rest:
                await app({**scope, "path": f"/{rest}", "root_path": f"/{name}"}, receive, send)
                return
        started = time.perf_counter()
        timing_token = None
        if self.config.server_timing:  # on every response (see server_timing.py)
            send, timing_token = tell_timing(send, ResponseTiming(time.monotonic()))
        try:
            if route is None:
                raise NotFound(f"no route {path!r}; each service is under /{{name}}/")
            method, handler, protected = route
            if scope["method"] != method:
                raise MethodNotAllowed(f"{path} takes {method}", allow=method)
            if protected and self._expected_authorization is not None:
                authorize(scope, self._expected_authorization)
            status = await handler(scope, receive, send)
        except ClientDisconnected:
            status = CLIENT_CLOSED
        except Exception as error:
            reply = error_reply(error)
            note_error(reply.error)
            body = JSON.encode(ErrorBody(reply.error, reply.message))
            await send_response(send, reply.status, body, JSON.media_type, reply.headers)
            status = reply.status
        finally:
            if timing_token is not None:
                forget(timing_token)
        label = path if route is not None else "other"
        self.metrics.shared.record(label, status, time.perf_counter() - started)

    async def _live(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, b'{"status":"live"}', JSON.media_type)
        return 200

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, self.metrics.render(), self.metrics.content_type)
        return 200

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> int:
        if self._draining or self._not_ready:
            raise NotReady("the server is shutting down")
        waiting = [name for name, app in self.apps.items() if not app.servable.ready]
        if waiting:
            raise NotReady(f"not ready: {', '.join(waiting)}")
        await send_response(send, 200, b'{"status":"ready"}', JSON.media_type)
        return 200

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Start every service (in order; a failure closes those started), close all."""
        started: list[Servable[Any, Any]] = []
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    for app in self.apps.values():
                        await app.servable.start()
                        started.append(app.servable)
                except Exception as error:
                    logger.exception("a service failed to start")
                    await asyncio.gather(*(s.close() for s in started), return_exceptions=True)
                    await send({"type": "lifespan.startup.failed", "message": str(error)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.begin_draining()
                outcomes = await asyncio.gather(
                    *(s.close() for s in started), return_exceptions=True
                )
                failed = [o for o in outcomes if isinstance(o, BaseException)]
                if failed:
                    logger.error("a service failed to close", exc_info=failed[0])
                    await send({"type": "lifespan.shutdown.failed", "message": str(failed[0])})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return
