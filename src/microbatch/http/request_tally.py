"""This process's finished requests, counted where each is answered: by route and
status, with a latency histogram by route.

Compiled with the hot path (``pyproject.toml``): the connection layer records every
request it answers here, without a Python call, in a few native fields (no tuple key,
no dict update for a 200). The Prometheus families are made from a snapshot at each
scrape (:class:`~microbatch.http.metrics.RequestCollector`).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["AccessLog", "RequestTally", "RouteTally"]

AccessLog = Callable[[str, str, str, int, float, str], None]
"""Logs one request: client, method, path, status, seconds, request id."""


class RouteTally:
    """One route's requests: how many ended with 200 and with each other status, how
    many took up to each latency bound (the last count: longer), and their seconds.

    Args:
        bounds: The latency buckets' upper bounds, ascending.
    """

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.ok = 0
        self.other_statuses: dict[int, int] = {}
        self.buckets = [0] * (len(bounds) + 1)
        self.seconds = 0.0

    def add(self, status: int, seconds: float) -> None:
        """Count one request."""
        if status == 200:
            self.ok += 1
        else:
            others = self.other_statuses
            others[status] = others.get(status, 0) + 1
        bounds = self.bounds
        index = 0
        last = len(bounds)
        while index < last and bounds[index] < seconds:  # as bisect_left finds it
            index += 1
        self.buckets[index] += 1
        self.seconds += seconds

    def statuses(self) -> dict[int, int]:
        """Requests by status."""
        counts = dict(self.other_statuses)
        if self.ok:
            counts[200] = self.ok
        return counts


class RequestTally:
    """Every route's :class:`RouteTally`. One event loop records: no lock.

    Args:
        bounds: The latency buckets' upper bounds, ascending.
    """

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = list(bounds)
        self.routes: dict[str, RouteTally] = {}
        self.access_log: AccessLog | None = None
        """Where :meth:`answered` logs each request (None: nowhere)."""

    def record(self, route: str, status: int, seconds: float) -> None:
        """Count one finished request and its latency."""
        tally = self.routes.get(route)
        if tally is None:
            tally = self.routes[route] = RouteTally(self.bounds)
        tally.add(status, seconds)

    def answered(
        self, route: str, status: int, seconds: float, request_id: str, client: str
    ) -> None:
        """Record a request answered without ASGI (``POST route``), and log it where
        :attr:`access_log` is set."""
        self.record(route, status, seconds)
        log = self.access_log
        if log is not None:
            log(client, "POST", route, status, seconds, request_id)
