"""Python callers of a deployed service: one item in, its own result out, through a
Ray ``DeploymentHandle``, with microbatch's errors rather than Ray's wrappers."""

from __future__ import annotations

import asyncio
from typing import Any

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from ..errors import Overloaded, StageFailed, WorkerDied
from ..tracing import current_traceparent

__all__ = ["ServiceClient"]


class ServiceClient:
    """Submit items to a microbatch deployment through its ``DeploymentHandle``.

    Errors are microbatch's own, whichever replica served the item: what the
    service raised in the replica (``Overloaded``, ``DeadlineExceeded``, the model's
    own exception, ...) is raised as itself, chained to Ray's error that carries the
    replica's traceback; a replica that died while it held the item raises
    :class:`~microbatch.errors.WorkerDied`; Ray's own backpressure raises
    :class:`~microbatch.errors.Overloaded`. The caller's current OpenTelemetry span
    goes along (its W3C ``traceparent``): in a replica that traces, the item's spans
    are its children.

    Args:
        handle: What ``serve.run(microbatch.ray.application(...))`` returned, or
            ``serve.get_deployment_handle(name, app_name)``.
    """

    def __init__(self, handle: Any) -> None:
        self._submit = handle.submit

    async def submit(self, item: Any, *, timeout_s: float | None = None) -> Any:
        """Run one item on some replica and return its result (from asyncio code).

        Args:
            item: The item.
            timeout_s: Seconds the item may take, from its arrival at the replica;
                at most, and by default, the deployment's default timeout (its
                ``HttpConfig.default_timeout_s``: 30 s unless told otherwise), the same
                as an HTTP request gets.

        Raises:
            WorkerDied: The replica holding the item died.
            Overloaded: The replica (or Ray's queue in front of it) is full.
            DeadlineExceeded: The deadline passed.
            Exception: The model's own error for this item.
        """
        response = self._submit.remote(item, timeout_s, current_traceparent())
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()  # an item not yet in a batch is then never computed
            raise
        except Exception as error:
            raise _unwrapped(error) from error

    def submit_blocking(self, item: Any, *, timeout_s: float | None = None) -> Any:
        """:meth:`submit` for threads (not from inside an event loop)."""
        try:
            return self._submit.remote(item, timeout_s, current_traceparent()).result()
        except Exception as error:
            raise _unwrapped(error) from error


def _unwrapped(error: Exception) -> Exception:
    """The error a microbatch caller expects in place of Ray's ``error``."""
    if isinstance(error, RayActorError):
        return WorkerDied(f"the Ray Serve replica holding this item died: {_first_line(error)}")
    if isinstance(error, BackPressureError):
        return Overloaded(str(error))
    if isinstance(error, DeploymentUnavailableError):
        return StageFailed(error.message)
    if isinstance(error, RayTaskError) and isinstance(error.cause, Exception):
        return error.cause
    return error


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
