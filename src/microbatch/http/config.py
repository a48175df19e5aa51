"""The HTTP app's settings: body limits, deadlines, the bearer token, what it logs
and tells (:class:`HttpConfig`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["HttpConfig"]


@dataclass(frozen=True)
class HttpConfig:
    """Settings of the HTTP app.

    Args:
        max_body_bytes: Largest request body; a larger one gets 413 without being
            read past the limit.
        default_timeout_s: A request's deadline, from its arrival; a client may lower
            it with ``X-Request-Timeout-Ms``. Past it: 504.
        body_timeout_s: Longest time to receive a request's body; past it: 408.
        auth_token: When set, every route except the health probes needs
            ``Authorization: Bearer <token>``.
        access_log: Log one line per request on ``microbatch.access``.
        api_title: The OpenAPI document's title (default: the served model's name).
        api_version: The OpenAPI document's version (default: microbatch's).
        server_timing: Tell each predict response's ``Server-Timing`` (queued, behind
            a running batch, model time and batch size, per stage).
        tracing: Trace every predict request with OpenTelemetry (needs
            ``microbatch[otel]``; spans go to the global tracer provider, see
            :mod:`microbatch.tracing`).

    Raises:
        ValueError: A setting is out of range; the message names it and its value.
    """

    max_body_bytes: int = 10 * 1024 * 1024
    default_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    auth_token: str | None = None
    access_log: bool = False
    api_title: str | None = None
    api_version: str | None = None
    server_timing: bool = True
    tracing: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be an int >= 1, got {self.max_body_bytes!r}")
        for name in ("default_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.auth_token is not None and not self.auth_token:
            raise ValueError("auth_token must be None or a non-empty string")
