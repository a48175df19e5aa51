"""What one load run counted (:class:`Tally`) and what it amounts to (:class:`RunResult`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["PERCENTILES", "RunResult", "Tally", "percentile"]

PERCENTILES = (50.0, 90.0, 99.0)
"""The latency percentiles every run reports (besides the maximum)."""


@dataclass
class Tally:
    """The raw counts of a run, added to as replies and failures arrive.

    Attributes:
        latencies_s: One entry per reply (any status), in seconds.
        statuses: Replies by status code.
        failures: Requests that got no reply, by kind (``timeout``, ``closed``,
            ``connect``, ``protocol``).
        unsent: Open loop only: arrivals that were due before the end but could not
            be sent because every allowed request was still outstanding.
    """

    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    unsent: int = 0

    def reply(self, status: int, latency_s: float) -> None:
        """Count one reply."""
        self.latencies_s.append(latency_s)
        self.statuses[status] += 1

    def fail(self, kind: str) -> None:
        """Count one request that got no reply."""
        self.failures[kind] += 1

    @property
    def requests(self) -> int:
        """Replies plus failures so far."""
        return len(self.latencies_s) + sum(self.failures.values())

    @property
    def errors(self) -> int:
        """Non-2xx replies plus failures so far."""
        bad = sum(count for status, count in self.statuses.items() if not 200 <= status < 300)
        return bad + sum(self.failures.values())


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of an ascending sequence (nan when empty)."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class RunResult:
    """One measured run: a concurrency level (closed loop) or a rate (open loop).

    Attributes:
        mode: ``"closed"`` (each connection sends its next request when its reply
            arrives) or ``"open"`` (Poisson arrivals at ``rate``).
        concurrency: Connections of a closed-loop run.
        rate: Offered requests/s of an open-loop run.
        elapsed_s: From the first request to the last reply.
        requests: Requests sent (``ok`` plus every error).
        replies: Requests that got a reply, of any status.
        ok: 2xx replies.
        errors: Non-2xx replies by status (``"404"``) and requests without a reply
            by kind (``"timeout"``, ``"closed"``, ``"connect"``, ``"protocol"``).
        latency_ms: ``p50``, ``p90``, ``p99``, ``max``, ``mean`` over every reply
            (nan without replies). Open loop: from the time the request was due,
            so waiting for a free connection counts.
        mean_batch_size: Mean batch size per stage during the run, from ``/metrics``
            (None when the server exposes no microbatch metrics).
        client_cpu: The load generator's CPU time over ``elapsed_s`` (1.0 = one core).
        unsent: Open loop: arrivals due but never sent (every allowed request outstanding).
    """

    mode: Literal["closed", "open"]
    concurrency: int | None
    rate: float | None
    elapsed_s: float
    requests: int
    replies: int
    ok: int
    errors: dict[str, int]
    latency_ms: dict[str, float]
    mean_batch_size: dict[str, float] | None
    client_cpu: float
    unsent: int = 0

    @property
    def req_per_s(self) -> float:
        """Replies (any status) per second."""
        return self.replies / self.elapsed_s if self.elapsed_s > 0 else math.nan

    @property
    def ok_per_s(self) -> float:
        """2xx replies per second."""
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else math.nan

    @property
    def label(self) -> str:
        """``c=16`` or ``rate=500/s``."""
        if self.mode == "closed":
            return f"c={self.concurrency}"
        return f"rate={self.rate:g}/s"

    @classmethod
    def from_tally(
        cls,
        tally: Tally,
        *,
        mode: Literal["closed", "open"],
        concurrency: int | None = None,
        rate: float | None = None,
        elapsed_s: float,
        cpu_s: float,
        mean_batch_size: Mapping[str, float] | None = None,
    ) -> RunResult:
        """Summarize a finished run's tally."""
        ordered = sorted(tally.latencies_s)
        latency = {f"p{q:g}": 1000.0 * percentile(ordered, q) for q in PERCENTILES}
        latency["max"] = 1000.0 * ordered[-1] if ordered else math.nan
        latency["mean"] = 1000.0 * sum(ordered) / len(ordered) if ordered else math.nan
        errors = {
            str(status): count
            for status, count in sorted(tally.statuses.items())
            if not 200 <= status < 300
        }
        errors.update(sorted(tally.failures.items()))
        ok = sum(count for status, count in tally.statuses.items() if 200 <= status < 300)
        return cls(
            mode=mode,
            concurrency=concurrency,
            rate=rate,
            elapsed_s=elapsed_s,
            requests=tally.requests,
            replies=len(tally.latencies_s),
            ok=ok,
            errors=errors,
            latency_ms=latency,
            mean_batch_size=None if mean_batch_size is None else dict(mean_batch_size),
            client_cpu=cpu_s / elapsed_s if elapsed_s > 0 else 0.0,
            unsent=tally.unsent,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (nan becomes None)."""
        return {
            "mode": self.mode,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "elapsed_s": self.elapsed_s,
            "requests": self.requests,
            "replies": self.replies,
            "ok": self.ok,
            "errors": self.errors,
            "req_per_s": _finite(self.req_per_s),
            "ok_per_s": _finite(self.ok_per_s),
            "latency_ms": {key: _finite(value) for key, value in self.latency_ms.items()},
            "mean_batch_size": self.mean_batch_size,
            "client_cpu": self.client_cpu,
            "unsent": self.unsent,
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
