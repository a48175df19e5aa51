"""A Service or ``@microbatch.batch`` function as a Ray Serve deployment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from ray import serve

from ..http.app import HttpConfig
from .recipe import Recipe, ServiceRecipe, recipe_for
from .replica import Replica
from .settings import ReplicaSettings, StageMode

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ReplicaOptions", "application", "deployment", "deployment_options"]

_SHUTDOWN_MARGIN_S = 10.0  # past the service's own grace, before Ray kills the replica


class ReplicaOptions(TypedDict, total=False):
    """Keyword settings of :func:`application`; see :class:`ReplicaSettings`."""

    num_replicas: int | None
    autoscaling: Mapping[str, Any] | None
    num_cpus: float
    num_gpus: float
    max_ongoing_requests: int | None
    stage_mode: StageMode
    ray_actor_options: Mapping[str, Any]
    graceful_shutdown_timeout_s: float | None


def deployment(
    served: object,
    settings: ReplicaSettings | None = None,
    *,
    http: HttpConfig | None = None,
    name: str | None = None,
) -> Any:
    """The Ray Serve ``Deployment`` of a service (unbound; see :func:`application`).

    Args:
        served: A :class:`~microbatch.Service` or a ``@microbatch.batch`` function,
            unchanged; every replica builds its own fresh copy of it.
        settings: Replicas and their resources (default: one replica, one CPU).
        http: The HTTP app's settings in every replica (limits, deadline, token).
        name: The deployment's name (default: the service's last stage, or the
            function's name).

    Raises:
        TypeError: ``served`` is neither a Service nor a batched function.
    """
    settings = settings if settings is not None else ReplicaSettings()
    recipe = recipe_for(served)
    options = deployment_options(recipe, settings, name)
    bound_http = http if http is not None else HttpConfig()
    return serve.deployment(Replica, **options).bind(recipe, settings.stage_mode, bound_http)


def deployment_options(
    recipe: Recipe, settings: ReplicaSettings, name: str | None = None
) -> dict[str, Any]:
    """The keyword arguments of ``serve.deployment`` for a recipe and its settings."""
    options: dict[str, Any] = {
        "name": name or recipe.name,
        # Past the service's own bound, so that the replica answers Overloaded at once.
        "max_ongoing_requests": settings.max_ongoing_requests
        or recipe.bound + recipe.items_per_replica,
        "ray_actor_options": settings.actor_options(),
        **settings.scaling(recipe.items_per_replica),
    }
    if settings.graceful_shutdown_timeout_s is not None:
        options["graceful_shutdown_timeout_s"] = settings.graceful_shutdown_timeout_s
    elif isinstance(recipe, ServiceRecipe):
        options["graceful_shutdown_timeout_s"] = recipe.grace_s + _SHUTDOWN_MARGIN_S
    return options


def application(
    served: object,
    *,
    http: HttpConfig | None = None,
    name: str | None = None,
    **options: Unpack[ReplicaOptions],
) -> Any:
    """A Ray Serve application serving ``served``: pass it to ``serve.run``.

    HTTP requests through Ray's proxy reach microbatch's own app in a replica (same
    routes, codecs and status codes as ``microbatch serve``); the ``DeploymentHandle``
    that ``serve.run`` returns takes one item with ``handle.submit.remote(item)``
    (or wrap it in :class:`~microbatch.ray.ServiceClient`).

    Args:
        served: A :class:`~microbatch.Service` or a ``@microbatch.batch`` function.
        http: The HTTP app's settings in every replica.
        name: The deployment's name.
        **options: :class:`ReplicaSettings` fields (``num_replicas``,
            ``autoscaling``, ``num_cpus``, ``num_gpus``, ``stage_mode``, ...).

    Raises:
        TypeError: ``served`` is neither a Service nor a batched function.
        ValueError: A setting is out of range.
    """
    return deployment(served, ReplicaSettings(**options), http=http, name=name)
