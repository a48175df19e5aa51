"""How ``microbatch bench`` shows what it measured: a table, JSON, and a plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..plotting import PlotUnavailable, pyplot
from .results import RunResult
from .runner import BenchReport

__all__ = ["PlotUnavailable", "plot", "to_json", "to_text"]


_COLUMNS = ("run", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors", "cpu")


def to_text(report: BenchReport) -> str:
    """The summary table, one row per level or rate, then any warnings."""
    plan = report.plan
    lines = [
        f"microbatch bench {report.url}",
        f"bodies: {report.bodies}; client event loop: {report.event_loop}",
        f"{plan.duration_s:g} s per run after {plan.warmup_s:g} s of warm-up; latency of "
        "every reply; cpu: the load generator's CPU time as a share of one core",
        "",
    ]
    rows: list[tuple[str, ...]] = [(*_COLUMNS, "mean batch")]
    for run in report.runs:
        latency = run.latency_ms
        rows.append(
            (
                run.label,
                f"{run.requests:,}",
                _number(run.req_per_s, 1),
                *(_number(latency[key], 2) for key in ("p50", "p90", "p99", "max")),
                _errors(run),
                f"{run.client_cpu:.0%}",
                _batches(run),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            cell.ljust(width) if i in (0, 7, 9) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines += [f"warning: {warning}" for warning in report.warnings]
    return "\n".join(lines)


def to_json(report: BenchReport) -> dict[str, Any]:
    """The report as JSON-ready data."""
    plan = report.plan
    return {
        "url": report.url,
        "bodies": report.bodies,
        "event_loop": report.event_loop,
        "duration_s": plan.duration_s,
        "warmup_s": plan.warmup_s,
        "timeout_s": plan.timeout_s,
        "max_outstanding": plan.max_outstanding,
        "runs": [run.to_json() for run in report.runs],
        "warnings": report.warnings,
    }


def plot(report: BenchReport, path: str | Path) -> None:
    """Latency percentiles and throughput against concurrency (closed loop) and
    against the offered rate (open loop), one row of two panels for each.

    Raises:
        PlotUnavailable: matplotlib is not installed.
    """
    plt = pyplot()
    groups = [
        (runs, xlabel, xs)
        for runs, xlabel, xs in (
            _group(report, "closed", "concurrency (connections)"),
            _group(report, "open", "offered rate (requests/s)"),
        )
        if runs
    ]
    figure, axes = plt.subplots(len(groups), 2, figsize=(11, 4 * len(groups)), squeeze=False)
    for row, (runs, xlabel, xs) in enumerate(groups):
        latency, throughput = axes[row]
        for key, style in (("p50", "o-"), ("p90", "s-"), ("p99", "^-"), ("max", "x:")):
            latency.plot(xs, [run.latency_ms[key] for run in runs], style, label=key)
        latency.set_ylabel("latency (ms)")
        latency.set_title("latency percentiles")
        throughput.plot(xs, [run.req_per_s for run in runs], "o-", label="replies/s")
        throughput.plot(xs, [run.ok_per_s for run in runs], "s--", label="2xx/s")
        if runs[0].mode == "open":
            throughput.plot(xs, xs, ":", color="gray", label="offered")
        throughput.set_ylabel("requests/s")
        throughput.set_ylim(bottom=0)
        throughput.set_title("throughput")
        for axis in (latency, throughput):
            axis.set_xlabel(xlabel)
            if len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 8:
                axis.set_xscale("log", base=2)
            axis.set_xticks(xs, [f"{x:g}" for x in xs])
            axis.grid(True, alpha=0.3)
            axis.legend()
    figure.suptitle(f"microbatch bench {report.url}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _group(report: BenchReport, mode: str, xlabel: str) -> tuple[list[RunResult], str, list[float]]:
    runs = sorted(
        (run for run in report.runs if run.mode == mode),
        key=lambda run: (run.concurrency or 0, run.rate or 0.0),
    )
    xs = [float((run.concurrency if mode == "closed" else run.rate) or 0) for run in runs]
    return runs, xlabel, xs


def _number(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}" if math.isfinite(value) else "n/a"


def _errors(run: RunResult) -> str:
    parts = [f"{kind}: {count:,}" for kind, count in run.errors.items()]
    if run.unsent:
        parts.append(f"unsent: {run.unsent:,}")
    return ", ".join(parts) or "0"


def _batches(run: RunResult) -> str:
    if run.mean_batch_size is None:
        return "n/a"
    if not run.mean_batch_size:
        return "-"
    if len(run.mean_batch_size) == 1:
        return f"{next(iter(run.mean_batch_size.values())):.1f}"
    return ", ".join(f"{stage} {size:.1f}" for stage, size in run.mean_batch_size.items())
