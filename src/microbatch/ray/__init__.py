"""The same Service on a Ray cluster: Ray Serve replicas, microbatch batching inside.

``application(service, num_replicas=2)`` is a Ray Serve application: pass it to
``serve.run``. Each replica builds its own copy of the service, serves microbatch's
HTTP app behind Ray's proxy and takes items from ``DeploymentHandle`` callers
(:class:`ServiceClient`). Needs the ``ray`` extra: ``pip install 'microbatch[ray]'``.
"""

try:
    from ray import serve as _serve  # noqa: F401
except ImportError as error:
    raise ImportError(
        f"microbatch.ray needs Ray Serve ({error}): pip install 'microbatch[ray]'"
    ) from error

from .application import ReplicaOptions, application, deployment, deployment_options
from .client import ServiceClient
from .recipe import FunctionRecipe, Recipe, ServiceRecipe, recipe_for
from .replica import Replica
from .settings import ReplicaSettings, StageMode

__all__ = [
    "FunctionRecipe",
    "Recipe",
    "Replica",
    "ReplicaOptions",
    "ReplicaSettings",
    "ServiceClient",
    "ServiceRecipe",
    "StageMode",
    "application",
    "deployment",
    "deployment_options",
    "recipe_for",
]
