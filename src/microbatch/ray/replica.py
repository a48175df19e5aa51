"""One Ray Serve replica: a fresh copy of the service behind microbatch's own HTTP app.

Ray's proxy hands each HTTP request to a replica's ASGI app, which is microbatch's
:class:`~microbatch.http.HttpApp`: the same routes, codecs and status codes as
``microbatch serve``. Ray runs the app's lifespan when the replica starts (the
service starts its stages and warms up before the replica takes traffic) and when
it stops (the service drains and stops). ``DeploymentHandle`` callers reach
:meth:`Replica.submit`, which feeds the same batcher as HTTP requests do.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from ..errors import BatcherClosed, StageFailed
from ..http.app import HttpApp, HttpConfig
from ..http.asgi import Receive, Scope, Send
from ..stats import ServiceStats
from ..types import deadline_from
from .recipe import Recipe
from .settings import StageMode

__all__ = ["Replica", "UnderRoutePrefix"]


class UnderRoutePrefix:
    """Serves an app under a Ray Serve ``route_prefix``: Ray passes the full path
    (``/embed/predict``) with the prefix as ``root_path`` (``/embed``), and the app's
    routes are relative to it.

    Args:
        app: The HTTP app.
    """

    def __init__(self, app: HttpApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Call the app with the path below ``root_path``."""
        prefix = scope.get("root_path", "").rstrip("/")
        path = scope.get("path", "")
        if prefix and (path == prefix or path.startswith(prefix + "/")):
            scope = {**scope, "path": path[len(prefix) :] or "/"}
        await self.app(scope, receive, send)


@serve.ingress()
class Replica:
    """A replica of a microbatch deployment (made by Ray, one per replica actor).

    Args:
        recipe: What to build the service from.
        stage_mode: Where a Service's stages run (see
            :class:`~microbatch.ray.ReplicaSettings`).
        http: The HTTP app's settings (limits, deadline, bearer token).
    """

    def __init__(self, recipe: Recipe, stage_mode: StageMode, http: HttpConfig) -> None:
        self._http = HttpApp(recipe.build(stage_mode), http)

    def __serve_build_asgi_app__(self) -> UnderRoutePrefix:
        """The ingress app; Ray runs its lifespan, which starts the service."""
        return UnderRoutePrefix(self._http)

    async def submit(self, item: Any, timeout_s: float | None = None, traceparent: str = "") -> Any:
        """Run one item through the service and return its result.

        The item enters here: its deadline is worked out once, in the replica's clock,
        and carried down. Without ``timeout_s`` it gets the same default as an HTTP
        request (``HttpConfig.default_timeout_s``, ``serve --timeout-ms``), which
        ``timeout_s`` may lower but not raise.

        Args:
            item: The item, as the service's first stage takes it.
            timeout_s: Seconds from now the caller will wait, measured in the replica.
            traceparent: The caller's W3C ``traceparent`` (what
                :class:`~microbatch.ray.ServiceClient` sends): when the replica
                traces (``HttpConfig(tracing=True)``), the item's span here is a
                child of the caller's span.

        Raises:
            ValueError: ``timeout_s`` is negative or not a number.
            Whatever the service raises for this item (``Overloaded``,
            ``DeadlineExceeded``, the model's error, ...); Ray carries it back.
        """
        if self._http.draining:
            raise BatcherClosed("the replica is shutting down")
        servable, deadline = self._http.servable, self.deadline(timeout_s)
        tracer = self._http.tracer
        if tracer is None:
            return await servable.submit(item, deadline=deadline)
        return await tracer.submit_carried(
            servable, item, deadline=deadline, traceparent=traceparent, name="microbatch replica"
        )

    def deadline(self, timeout_s: float | None) -> float | None:
        """The deadline of an item a handle caller submits now (see :meth:`submit`)."""
        return deadline_from(timeout_s, deadline_from(self._http.config.default_timeout_s))

    async def stats(self) -> ServiceStats:
        """This replica's counters: its stages' workers and batching."""
        return self._http.servable.stats()

    async def check_health(self) -> None:
        """Ray's periodic health check: a replica whose service cannot take items
        (a stage without a live worker) fails it, and after a few failures in a row
        Ray replaces the replica.

        Raises:
            StageFailed: The service is not ready and not shutting down.
        """
        if not self._http.servable.ready and not self._http.draining:
            raise StageFailed("the service in this replica is not ready")
