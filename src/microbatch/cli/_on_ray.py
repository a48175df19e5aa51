"""``microbatch serve MODULE:ATTR --ray``: settings from the command line, then the
application deployed on a Ray cluster (:mod:`microbatch.ray._serving`).

What works here as in the other modes: the HTTP app's settings (``--timeout-ms``,
``--body-timeout-s``, ``--max-body-bytes``, ``--auth-token``) live in microbatch's
ASGI app inside every replica, and the default deadline applies to
``DeploymentHandle`` callers too; ``--graceful-timeout-s`` is each replica's graceful
shutdown timeout. Flags about microbatch's own HTTP server are refused by
:mod:`._options` before anything here runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ..http.app import HttpConfig
from ..loading import load_target
from ._config import apply_stage_settings
from ._options import Parsed
from ._serving import configure_logging, http_config, warn_if_open

__all__ = ["RayPlan", "ray_plan", "run_serve_on_ray"]


@dataclass(frozen=True)
class RayPlan:
    """What ``serve --ray`` deploys, and where.

    Attributes:
        application: The Ray Serve application (bound deployment).
        http: The HTTP app's settings in every replica.
        replicas: The replicas' settings (a ``ReplicaSettings``).
        cluster: Where and how it is served (a ``RayServeSettings``).
    """

    application: Any
    http: HttpConfig
    replicas: Any
    cluster: Any


def ray_plan(options: Parsed) -> RayPlan:
    """Build the application and its settings from the command line (Ray imported here).

    Raises:
        ImportError: Ray Serve is not installed, or the target cannot be imported.
        AttributeError: The target is not in its module.
        ValueError: A setting is out of range.
        TypeError: The target is neither a Service nor a batched function.
    """
    from ..ray._serving import RayServeSettings
    from ..ray.application import deployment
    from ..ray.settings import ReplicaSettings

    served = apply_stage_settings(load_target(options.target), options.stage)
    replicas = ReplicaSettings(
        num_replicas=options.replicas,
        num_cpus=options.replica_cpus,
        num_gpus=options.replica_gpus,
        stage_mode=options.replica_stages,
        graceful_shutdown_timeout_s=(
            options.graceful_timeout_s if "graceful_timeout_s" in options.given else None
        ),
    )
    http = http_config(options)
    cluster = RayServeSettings(
        options.ray_address or None, options.host, options.port, log_level=options.log_level
    )
    return RayPlan(deployment(served, replicas, http=http), http, replicas, cluster)


def run_serve_on_ray(options: Parsed) -> int:
    """Run ``microbatch serve --ray``; return the exit status (2: a bad target or
    setting, or no Ray; 1: the cluster or the deployment failed)."""
    try:
        from ..ray._serving import serve_on_ray
    except ImportError as error:
        print(f"microbatch serve --ray: {error}", file=sys.stderr)
        return 2
    configure_logging(options.log_level)
    try:
        plan = ray_plan(options)
    except (ImportError, AttributeError, ValueError, TypeError) as error:
        print(f"microbatch serve: {error}", file=sys.stderr)
        return 2
    warn_if_open(options.host, plan.http.auth_token)
    try:
        return serve_on_ray(plan.application, plan.cluster)
    except ConnectionError as error:
        print(f"microbatch serve --ray: {error}", file=sys.stderr)
        return 1
    except RuntimeError as error:
        print(f"microbatch serve --ray: the service did not deploy: {error}", file=sys.stderr)
        return 1
