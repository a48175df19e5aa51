"""What a shutdown signal does: readiness turns 503 at once, requests are still
served for the drain delay (while a load balancer, such as Kubernetes removing the
pod's endpoint, stops sending new ones), then the app drains and the server stops.

Without a delay the listener closed ~50 ms after SIGTERM, so in Kubernetes new
connections were refused until the endpoint was removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

__all__ = ["Drainable", "ShutdownSequence"]

logger = logging.getLogger("microbatch.http")


class Drainable(Protocol):
    """The app's side of a shutdown (:class:`~microbatch.http.app.HttpApp`)."""

    def stop_being_ready(self) -> None:
        """Readiness 503; requests still served."""

    def begin_draining(self) -> None:
        """Readiness 503 and no new item taken."""


class _Timer(Protocol):
    def cancel(self) -> None: ...


class ShutdownSequence:
    """Turns shutdown signals into readiness 503, the delay, then ``stop()``.

    Args:
        app: The app being served.
        delay_s: Seconds between the signal and the drain (0: drain at once).
        stop: Begins the server's graceful shutdown (stop accepting, finish
            in-flight requests).
        call_later: Schedules a callback in seconds (the event loop's
            ``call_later``; a fake one in tests).
    """

    def __init__(
        self,
        app: Drainable,
        delay_s: float,
        stop: Callable[[], None],
        call_later: Callable[[float, Callable[[], None]], _Timer],
    ) -> None:
        if not delay_s >= 0:
            raise ValueError(f"delay_s must be a number >= 0, got {delay_s!r}")
        self._app = app
        self._delay_s = delay_s
        self._stop = stop
        self._call_later = call_later
        self._timer: _Timer | None = None
        self._stopped = False

    def signalled(self) -> None:
        """A shutdown signal: the first starts the delay, a second ends it now."""
        if self._stopped:
            return
        if self._timer is not None or self._delay_s == 0:
            self._drain()
            return
        self._app.stop_being_ready()
        logger.info(
            "shutting down in %.1f s: readiness answers 503, requests are still served",
            self._delay_s,
        )
        self._timer = self._call_later(self._delay_s, self._drain)

    def _drain(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._app.begin_draining()
        self._stop()
