"""How ``microbatch tune`` shows its advice: a text report, JSON, and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..plotting import PlotUnavailable, pyplot
from .advice import Advice, StageAdvice

__all__ = ["PlotUnavailable", "plot", "to_json", "to_text"]


def to_text(advice: Advice, target: str = "") -> str:
    """A table of the measurements and the advice, per stage and for the pipeline."""
    lines = [f"microbatch tune {target}".rstrip() + f": latency target p99 {advice.p99_ms:g} ms"]
    for stage in advice.stages:
        lines += ["", *_stage_lines(stage, advice.gain)]
    lines += [
        "",
        f"pipeline: ~{advice.items_per_s:,.0f} items/s (bottleneck: {advice.bottleneck}); "
        f"latency ~{advice.light_latency_ms:.1f} ms alone, "
        f"up to ~{advice.worst_latency_ms:.1f} ms under full load",
    ]
    if advice.serving_items_per_s is not None:
        lines.append(
            f"serving path (HTTP app over an instant model, in-process, no sockets): "
            f"~{advice.serving_items_per_s:,.0f} requests/s"
        )
    if not advice.feasible:
        lines.append(
            f"warning: the target cannot be met: batches of one already take "
            f"{advice.light_latency_ms:.1f} ms through the pipeline, "
            f"~{2 * advice.light_latency_ms:.1f} ms under full load"
        )
    lines.append("throughput assumes each worker has a core (or accelerator) of its own")
    return "\n".join(lines)


def _stage_lines(stage: StageAdvice, gain: float) -> list[str]:
    curve = stage.curve
    workers = f"{curve.workers} worker{'s' if curve.workers > 1 else ''}"
    lines = [f"stage {curve.name} ({workers})", "    batch    ms/batch     items/s"]
    for point in curve.points:
        mark = "  <- advised" if point.batch_size == stage.max_batch_size else ""
        lines.append(
            f"  {point.batch_size:>7} {1000 * point.seconds:>11.2f} "
            f"{curve.items_per_s(point):>11,.1f}{mark}"
        )
    lines.append(f"  cost model: {stage.fixed_ms:.3f} ms + {stage.per_item_ms:.4f} ms x items")
    if stage.knee < curve.points[-1].batch_size:
        lines.append(
            f"  throughput stops growing past batch {stage.knee} "
            f"(less than {gain:.0%} more at any larger size)"
        )
    else:
        lines.append(f"  throughput still grows at batch {stage.knee}, the largest measured")
    if curve.memory_limit is not None:
        lines.append(f"  ran out of memory at batch {curve.memory_limit}")
    cost = "" if stage.max_batch_cost is None else f"max_batch_cost={stage.max_batch_cost:g}, "
    lines.append(
        f"  advised: BatchConfig(max_batch_size={stage.max_batch_size}, {cost}"
        f"max_latency_ms={stage.max_latency_ms:.1f}) -> ~{stage.items_per_s:,.0f} items/s, "
        f"batches of {stage.batch_ms:.1f} ms, up to ~{stage.worst_latency_ms:.1f} ms "
        f"in the stage under full load"
    )
    return lines


def to_json(advice: Advice, target: str = "") -> dict[str, Any]:
    """The advice as plain JSON-ready data."""
    return {
        "target": target,
        "p99_ms": advice.p99_ms,
        "gain": advice.gain,
        "feasible": advice.feasible,
        "serving_items_per_s": advice.serving_items_per_s,
        "items_per_s": advice.items_per_s,
        "bottleneck": advice.bottleneck,
        "light_latency_ms": advice.light_latency_ms,
        "worst_latency_ms": advice.worst_latency_ms,
        "stages": [
            {
                "name": s.curve.name,
                "workers": s.curve.workers,
                "measurements": [
                    {
                        "batch_size": p.batch_size,
                        "ms": 1000 * p.seconds,
                        "items_per_s": s.curve.items_per_s(p),
                    }
                    for p in s.curve.points
                ],
                "memory_limit": s.curve.memory_limit,
                "knee": s.knee,
                "cost_model": {"fixed_ms": s.fixed_ms, "per_item_ms": s.per_item_ms},
                "recommended": {
                    "max_batch_size": s.max_batch_size,
                    "max_batch_cost": s.max_batch_cost,
                    "max_latency_ms": round(s.max_latency_ms, 3),
                },
                "expected": {
                    "items_per_s": s.items_per_s,
                    "batch_ms": s.batch_ms,
                    "worst_latency_ms": s.worst_latency_ms,
                },
            }
            for s in advice.stages
        ],
    }


def plot(advice: Advice, path: str | Path, target: str = "") -> None:
    """Draw time per batch and items/s against batch size, one row per stage.

    Raises:
        PlotUnavailable: matplotlib is not installed.
    """
    plt = pyplot()
    rows = len(advice.stages)
    figure, axes = plt.subplots(rows, 2, figsize=(10, 3.2 * rows), squeeze=False)
    for (left, right), stage in zip(axes, advice.stages, strict=True):
        sizes = [p.batch_size for p in stage.curve.points]
        left.plot(sizes, [1000 * p.seconds for p in stage.curve.points], "o-", label="measured")
        left.plot(
            sizes,
            [stage.fixed_ms + stage.per_item_ms * n for n in sizes],
            "--",
            color="grey",
            label=f"fit {stage.fixed_ms:.2f} + {stage.per_item_ms:.3f}·n ms",
        )
        left.set_ylabel("ms per batch")
        left.set_title(f"{stage.curve.name}: time per batch")
        right.plot(sizes, [stage.curve.items_per_s(p) for p in stage.curve.points], "o-")
        right.set_ylabel("items/s")
        workers = stage.curve.workers
        right.set_title(f"{stage.curve.name}: throughput ({workers} worker{'s' * (workers > 1)})")
        right.set_ylim(bottom=0)
        for axis in (left, right):
            axis.set_xscale("log", base=2)
            axis.set_xticks(sizes, [str(n) for n in sizes])
            axis.set_xlabel("batch size")
            axis.axvline(stage.max_batch_size, color="tab:red", linestyle=":")
            axis.grid(True, alpha=0.3)
        right.annotate(
            f"advised {stage.max_batch_size}\n~{stage.items_per_s:,.0f}/s",
            (stage.max_batch_size, stage.items_per_s),
            textcoords="offset points",
            xytext=(-60, -30),
            color="tab:red",
        )
        left.legend(loc="upper left", fontsize="small")
    figure.suptitle(
        f"microbatch tune {target} (p99 target {advice.p99_ms:g} ms)".replace("  ", " ")
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
