"""One ``bench`` session: every concurrency level and rate, each warmed up, measured,
and read against the server's batch sizes and the load generator's own CPU use."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from .bodies import Bodies
from .client import Endpoint
from .load import closed_loop, open_loop
from .progress import Progress
from .results import RunResult, Tally
from .scrape import mean_batch_sizes, scrape

__all__ = [
    "CPU_WARNING",
    "BenchPlan",
    "BenchReport",
    "run_bench",
    "run_in_event_loop",
    "warnings_for",
]

T = TypeVar("T")

CPU_WARNING = 0.85
"""Client CPU (fraction of one core) past which the load generator may be the bottleneck:
its event loop runs on one core, so near 1.0 it, not the server, sets the pace."""


@dataclass(frozen=True)
class BenchPlan:
    """What to run.

    Args:
        endpoint: Where requests go.
        concurrency: Closed-loop levels (connections), run in order.
        rates: Open-loop rates (requests/s, Poisson arrivals), run after the levels.
        duration_s: Measured seconds per level or rate.
        warmup_s: Unmeasured seconds before each (0 for none).
        timeout_s: A request without a reply by then counts as ``timeout``.
        max_outstanding: Open loop: most requests waiting for replies at once.
        seed: Seed of the open loop's arrival times.

    Raises:
        ValueError: A setting is out of range; the message names it and its value.
    """

    endpoint: Endpoint
    concurrency: tuple[int, ...] = (1, 16, 64)
    rates: tuple[float, ...] = ()
    duration_s: float = 10.0
    warmup_s: float = 1.0
    timeout_s: float = 30.0
    max_outstanding: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.concurrency and not self.rates:
            raise ValueError("nothing to run: give concurrency levels or rates")
        for level in self.concurrency:
            if not isinstance(level, int) or level < 1:
                raise ValueError(f"concurrency levels must be ints >= 1, got {level!r}")
        for rate in self.rates:
            if not 0 < rate < math.inf:
                raise ValueError(f"rates must be finite numbers > 0, got {rate!r}")
        for name in ("duration_s", "timeout_s"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not 0 <= self.warmup_s < math.inf:
            raise ValueError(f"warmup_s must be a finite number >= 0, got {self.warmup_s!r}")
        if self.max_outstanding < 1:
            raise ValueError(f"max_outstanding must be >= 1, got {self.max_outstanding!r}")


@dataclass
class BenchReport:
    """Everything one session measured.

    Attributes:
        url: The URL requests went to.
        bodies: Where the request bodies came from.
        plan: The settings it ran with.
        runs: One result per level and rate, in the order run.
        warnings: Things that make the numbers doubtful (client CPU, unsent arrivals,
            nothing succeeded).
        event_loop: The client's event loop (``uvloop`` or ``asyncio``).
    """

    url: str
    bodies: str
    plan: BenchPlan
    event_loop: str = "asyncio"
    runs: list[RunResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


async def run_bench(plan: BenchPlan, bodies: Bodies, progress: Progress) -> BenchReport:
    """Run every level, then every rate; return what was measured."""
    endpoint = plan.endpoint
    requests = [endpoint.post(body) for body in bodies.items]
    loop_module = type(asyncio.get_running_loop()).__module__
    report = BenchReport(
        endpoint.base + endpoint.path,
        bodies.source,
        plan,
        event_loop="uvloop" if loop_module.startswith("uvloop") else "asyncio",
    )
    for level in plan.concurrency:

        def closed(tally: Tally, seconds: float, level: int = level) -> Awaitable[float]:
            return closed_loop(
                endpoint,
                requests,
                concurrency=level,
                duration_s=seconds,
                timeout_s=plan.timeout_s,
                tally=tally,
            )

        run = await _measure(plan, progress, f"c={level}", closed, "closed", level, None)
        report.runs.append(run)
    rng = random.Random(plan.seed)
    for rate in plan.rates:

        def opened(tally: Tally, seconds: float, rate: float = rate) -> Awaitable[float]:
            return open_loop(
                endpoint,
                requests,
                rate=rate,
                duration_s=seconds,
                timeout_s=plan.timeout_s,
                max_outstanding=plan.max_outstanding,
                tally=tally,
                rng=rng,
            )

        run = await _measure(plan, progress, f"rate={rate:g}/s", opened, "open", None, rate)
        report.runs.append(run)
    report.warnings = warnings_for(report.runs, plan.max_outstanding)
    return report


async def _measure(
    plan: BenchPlan,
    progress: Progress,
    label: str,
    offer: Callable[[Tally, float], Awaitable[float]],
    mode: Literal["closed", "open"],
    concurrency: int | None,
    rate: float | None,
) -> RunResult:
    """Warm up, then one measured run between two scrapes of ``/metrics``."""
    if plan.warmup_s > 0:
        warmup = Tally()
        async with progress.showing(f"{label} warm-up", plan.warmup_s, warmup):
            await offer(warmup, plan.warmup_s)
    before = await scrape(plan.endpoint)
    tally = Tally()
    cpu_before = time.process_time()
    async with progress.showing(label, plan.duration_s, tally):
        elapsed_s = await offer(tally, plan.duration_s)
    cpu_s = time.process_time() - cpu_before
    after = await scrape(plan.endpoint)
    batches = None if after is None else mean_batch_sizes(before or {}, after)
    return RunResult.from_tally(
        tally,
        mode=mode,
        concurrency=concurrency,
        rate=rate,
        elapsed_s=elapsed_s,
        cpu_s=cpu_s,
        mean_batch_size=batches,
    )


def warnings_for(runs: Sequence[RunResult], max_outstanding: int) -> list[str]:
    """What makes these numbers doubtful, one sentence each."""
    warnings = []
    for run in runs:
        if run.client_cpu >= CPU_WARNING:
            warnings.append(
                f"{run.label}: the load generator used {run.client_cpu:.0%} of a CPU core, so "
                "it may be the bottleneck and the server may do more than measured; use fewer "
                "connections or run several bench processes"
            )
        if run.unsent:
            warnings.append(
                f"{run.label}: {run.unsent} arrivals were never sent because {max_outstanding} "
                "requests were outstanding: the service is slower than the offered rate "
                "(lower --rate or raise --max-outstanding)"
            )
        if run.requests and not run.ok:
            warnings.append(
                f"{run.label}: no request succeeded ({_top_errors(run)}): check the URL and "
                "the request bodies (--body-file)"
            )
    return warnings


def _top_errors(run: RunResult) -> str:
    ordered = sorted(run.errors.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{count} x {kind}" for kind, count in ordered[:3])


def run_in_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when it is installed (it comes with ``uvicorn[standard]``
    and halves the client's CPU per request), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
