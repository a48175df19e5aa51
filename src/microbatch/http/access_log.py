"""The access log: one line per finished request, written by the app (so it is the
same under any ASGI server), on the ``microbatch.access`` logger."""

from __future__ import annotations

import logging

from .asgi import Scope

__all__ = ["ACCESS_LOGGER", "log_access", "log_access_line"]

ACCESS_LOGGER = logging.getLogger("microbatch.access")
"""Where the access log goes (INFO level); its records carry the fields as extras."""


def log_access(scope: Scope, status: int, seconds: float, request_id: str) -> None:
    """Log one finished ASGI request (see :func:`log_access_line`)."""
    peer = scope.get("client")
    client = "-" if peer is None else f"{peer[0]}:{peer[1]}"
    log_access_line(client, scope["method"], scope["path"], status, seconds, request_id)


def log_access_line(
    client: str, method: str, path: str, status: int, seconds: float, request_id: str
) -> None:
    """Log one finished request: ``CLIENT METHOD PATH STATUS DURATION`` and, as
    fields (JSON), ``method``, ``path``, ``status``, ``duration_ms``, ``client`` and
    the request id. A status of 499: the client left before its answer."""
    if not ACCESS_LOGGER.isEnabledFor(logging.INFO):
        return
    duration_ms = round(seconds * 1000, 3)
    ACCESS_LOGGER.info(
        "%s %s %s %d %.1fms",
        client,
        method,
        path,
        status,
        duration_ms,
        extra={
            "method": method,
            "path": path,
            "status": status,
            "duration_ms": duration_ms,
            "client": client,
            "request_id": request_id,
        },
    )
