"""The streaming benchmark's figures and report: chunks/s and latency percentiles
of a run's records, the markdown tables, and the issue's targets checked."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from stream_models import MAX_ACTIVE, step_time_s

from microbatch.plotting import PlotUnavailable, pyplot


def summarise(records: list[tuple[int, float, float, bool]], wall: float) -> dict[str, Any]:
    """Chunks/s and the latency percentiles of (length, first chunk s, total s, opened
    at the start) records; the start is each client's first stream (every client
    opens one at once), whose first chunk waits behind all the others' start."""
    firsts = sorted(r[1] for r in records)
    later = sorted(r[1] for r in records if not r[3])
    short = sorted(r[2] for r in records if r[0] <= 16)
    long = sorted(r[2] for r in records if r[0] >= 128)
    return {
        "streams": len(records),
        "chunks": sum(r[0] for r in records),
        "seconds": wall,
        "chunks_per_s": sum(r[0] for r in records) / wall,
        "ttfc_p50_ms": 1000 * percentile(firsts, 0.50),
        "ttfc_p99_ms": 1000 * percentile(firsts, 0.99),
        "ttfc_p99_after_start_ms": 1000 * percentile(later, 0.99),
        "short_total_p50_ms": 1000 * percentile(short, 0.50),
        "short_total_p99_ms": 1000 * percentile(short, 0.99),
        "long_total_p50_ms": 1000 * percentile(long, 0.50),
        "long_total_p99_ms": 1000 * percentile(long, 0.99),
    }


def microbatch_build() -> str:
    """Which build of microbatch this interpreter runs: a regular install compiles the
    hot path with mypyc (as users get it from ``pip install``), an editable one is
    pure Python (hatch_build.py)."""
    import microbatch.stepping

    if Path(microbatch.stepping.__file__ or "").suffix in (".so", ".pyd"):
        return "compiled (a regular install: the hot path built with mypyc, as users get it)"
    return "pure Python (an editable install: nothing compiled)"


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median chunks/s (the lower middle one of an even count)."""
    ordered = sorted(runs, key=lambda figures: figures["chunks_per_s"])
    return dict(ordered[(len(ordered) - 1) // 2])


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nan when there are none)."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(results: dict[str, Any]) -> list[str]:
    """One markdown row per contender and level."""
    lines = [
        "| contender | streams | chunks/s | TTFC p50 ms | TTFC p99 ms"
        " | short (≤16) total p50/p99 ms | long (≥128) total p50/p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, f in results.items():
        lines.append(
            f"| {key} | {f['streams']} | {f['chunks_per_s']:.0f} | {f['ttfc_p50_ms']:.1f}"
            f" | {f['ttfc_p99_ms']:.1f}"
            f" | {f['short_total_p50_ms']:.0f} / {f['short_total_p99_ms']:.0f}"
            f" | {f['long_total_p50_ms']:.0f} / {f['long_total_p99_ms']:.0f} |"
        )
    return lines


def targets(results: dict[str, Any], ours: str, level: int, step_ms: float) -> list[str]:
    """The issue's targets for ``ours`` against every other contender at ``level``."""
    mine = results.get(f"{ours} @ {level}")
    if mine is None:
        return []
    lines = [f"{ours} at {level} streams (one step: {step_ms:.2f} ms):", ""]
    for key, other in results.items():
        if not key.endswith(f" @ {level}") or key.startswith(ours):
            continue
        name = key.rsplit(" @ ", 1)[0]
        ratio = mine["chunks_per_s"] / other["chunks_per_s"]
        goal = 1.0 if other["stepwise"] else 2.0
        verdict = "met" if ratio >= goal else "missed"
        line = f"- chunks/s ÷ {name}: **{ratio:.2f}x** (target ≥ {goal:.0f}x: {verdict})"
        if not other["stepwise"]:
            short = mine["short_total_p99_ms"] / other["short_total_p99_ms"]
            verdict = "met" if short <= 1 / 3 else "missed"
            line += f"; short streams' total p99 ratio **{short:.2f}** (target ≤ 0.33: {verdict})"
        lines.append(line)
    ttfc = mine["ttfc_p99_ms"] / step_ms
    verdict = "met" if ttfc <= 5 else "missed"
    line = f"- TTFC p99 = **{ttfc:.1f} step times** (target ≤ 5: {verdict})"
    after_start = mine.get("ttfc_p99_after_start_ms")
    if after_start is not None:  # not in results written before it was measured
        line += (
            f"; without each client's first stream (all {level} opened at once):"
            f" {after_start / step_ms:.1f} step times"
        )
    lines += [line, ""]
    return lines


def repeats(results: dict[str, Any], ours: str) -> list[str]:
    """Every repeat's chunks/s ratio of ``ours`` over its lockstep run, per level."""
    lines = []
    for key, figures in results.items():
        ratios = figures.get("ratios") if key.startswith(ours) else None
        if ratios:
            ordered = sorted(ratios)
            listed = ", ".join(f"{ratio:.2f}" for ratio in ratios)
            middle = ordered[(len(ordered) - 1) // 2]
            lines.append(
                f"- {key}: step-wise ÷ lockstep in each repeat: {listed}"
                f" (median {middle:.2f}x, {sum(r >= 2 for r in ratios)} of {len(ratios)} ≥ 2x)"
            )
    return [*lines, ""] if lines else []


_OPENAI = "(OpenAI chat SSE)"  # in the label of every contender speaking OpenAI's chat
OURS_OVER_HTTP = {
    False: "microbatch step-wise (HTTP, NDJSON)",
    True: f"microbatch step-wise {_OPENAI}",
}
"""Per protocol (OpenAI's or not), the contender the others speaking it are compared with."""


def _http_targets(results: dict[str, Any], step_ms: float) -> list[str]:
    """The targets over HTTP: each protocol's contenders against ours speaking it."""
    lines: list[str] = []
    for openai, ours in OURS_OVER_HTTP.items():
        speaking = {key: f for key, f in results.items() if (_OPENAI in key) == openai}
        lines += targets(speaking, ours, 64, step_ms)
    return lines


_WHERE = {
    "process": "the model in a worker process, as `examples.generate` serves it",
    "thread": "the model in a thread of the serving process (sharing the GIL with the"
    " loop that hands out its chunks)",
}


def report(
    inproc: dict[str, Any],
    generative: dict[str, dict[str, Any]],
    http: dict[str, Any],
    seen: dict[str, str],
    levels: list[int],
    kept_alive: dict[str, Any] | None = None,
) -> str:
    step_ms = 1000 * step_time_s(MAX_ACTIVE)
    lines = [
        "# Streams: step-wise against lockstep (`benchmarks/streaming.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python"
        f" {platform.python_version()}; shared with other jobs (other engineers' test"
        " runs) while it ran, so absolute numbers are noisy: read the ratios, all from"
        " one run.",
        "",
        f"In-process contenders: microbatch {microbatch_build()}.",
        "",
        "Simulated step model: each step sleeps 1 ms + 10 us x items in the step; output"
        " lengths log-uniform in [8, 256] (the same list for every contender); closed"
        " loop (a client opens its next stream when its last one ended); at most 64"
        " items per step everywhere. Step-wise: items join and leave between steps."
        " Lockstep: a batch runs until its longest item ends, every step costing the"
        " whole batch.",
        "",
        "## In-process (`service.stream`: the batching strategy alone)",
        "",
        *table(inproc),
        "",
        *targets(inproc, "microbatch step-wise", 64, step_ms),
    ]
    for mode, results in generative.items():
        mean_step = results.get("generate.py step-wise @ 64", {}).get("mean_step_ms", 0.0)
        lines += [
            f"## The generative example (`examples/generate.py`, in-process): {_WHERE[mode]}",
            "",
            "A character GRU (torch, hidden 128, one thread) trained 2 s at start-up;"
            " lengths drawn as above as `max_tokens`. Lockstep: the same model as a"
            " generator `predict`, every step over the whole batch. Each contender ran"
            " several times, alternated with the other; the table shows its run of"
            " median chunks/s.",
            "",
            *table(results),
            "",
            *targets(results, "generate.py step-wise", 64, mean_step),
            *repeats(results, "generate.py step-wise"),
        ]
    if http:
        lines += [
            "## Over HTTP (one stream per connection, the client counts chunks as they arrive)",
            "",
            *table(http),
            "",
            *_http_targets(http, step_ms),
        ]
    if kept_alive:
        lines += [
            "## Over HTTP, connections kept alive (`--connections both`)",
            "",
            "The same client for every contender, each of its clients reusing one"
            " connection for its next stream (as pooled clients like httpx do) instead"
            " of a new connection per stream.",
            "",
            *table(kept_alive),
            "",
            *_http_targets(kept_alive, step_ms),
        ]
    if http or kept_alive:
        lines += [
            "Versions:",
            "",
            *(f"- {label}: {text}" for label, text in seen.items()),
            "",
        ]
    return "\n".join(lines)


def plot(payload: dict[str, Any], path: Any) -> bool:
    """Chunks/s and time to first chunk p99 of every contender, at each level, over
    HTTP with a new connection per stream (the in-process contenders too, where
    there are no HTTP figures); False without matplotlib."""
    try:
        plt = pyplot()
    except PlotUnavailable:
        print("(matplotlib not installed: no plot)")
        return False
    results = payload.get("http") or payload.get("in_process") or {}
    by_contender: dict[str, dict[int, dict[str, Any]]] = {}
    for key, figures in results.items():
        name, _, level = key.rpartition(" @ ")
        by_contender.setdefault(name, {})[int(level)] = figures
    levels = sorted({level for rows in by_contender.values() for level in rows})
    figure, (rate, first) = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / max(1, len(by_contender))
    for at, (name, rows) in enumerate(by_contender.items()):
        xs = [index + at * width for index, level in enumerate(levels) if level in rows]
        kept = [level for level in levels if level in rows]
        rate.bar(xs, [rows[level]["chunks_per_s"] for level in kept], width, label=name)
        first.bar(xs, [rows[level]["ttfc_p99_ms"] for level in kept], width, label=name)
    centre = 0.4 - width / 2
    for axes, title, unit in (
        (rate, "throughput", "chunks/s"),
        (first, "time to first chunk, p99 (log)", "ms"),
    ):
        axes.set_xticks([index + centre for index in range(len(levels))])
        axes.set_xticklabels([f"{level} streams" for level in levels])
        axes.set_title(title)
        axes.set_ylabel(unit)
        axes.grid(True, axis="y", alpha=0.3)
    first.set_yscale("log")
    handles, labels = rate.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    figure.tight_layout(rect=(0, 0.05 + 0.04 * ((len(labels) + 2) // 3), 1, 1))
    figure.savefig(path, dpi=100)
    return True
