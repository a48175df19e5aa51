"""The HTTP serving benchmark's report (``benchmarks/http_serving.py``): microbatch's
throughput over each peer's, the markdown tables of ``http.json``, and the plot
(throughput and p99 against connections)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from harness import SERVERS, fmt

sys.path.insert(0, str(SERVERS))
from workloads import MAX_BATCH, WAIT_MS


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """microbatch / peer req/s, per workload and level, for each microbatch variant
    that ran (keys: ``peer`` for plain microbatch, ``variant / peer`` for others)."""
    out: dict[str, Any] = {}
    for workload, by_contender in results.items():
        for variant, mine in by_contender.items():
            if not variant.startswith("microbatch") or "levels" not in mine:
                continue
            for peer, data in by_contender.items():
                if peer.startswith("microbatch") or "levels" not in data:
                    continue
                key = peer if variant == "microbatch" else f"{variant} / {peer}"
                out.setdefault(workload, {})[key] = {
                    str(a["connections"]): a["req_per_s"] / b["req_per_s"]
                    for a, b in zip(mine["levels"], data["levels"], strict=True)
                }
    return out


def markdown(report: dict[str, Any]) -> str:
    """The tables of ``http.json`` as markdown."""
    lines = [
        "# HTTP serving, side by side",
        "",
        f"{report['machine']}; wrk closed loop, {report['duration_s']:g} s per level after "
        f"{report['warmup_s']:g} s warm-up. Max batch {MAX_BATCH}; wait "
        + ", ".join(f"{name} {ms:g} ms" for name, ms in WAIT_MS.items())
        + ". CPU/req: CPU time over the run per request, of the serving process "
        "(server) and of all the server's processes (all).",
        "",
    ]
    for workload, by_contender in report["results"].items():
        lines += [
            f"## Workload `{workload}`",
            "",
            "| contender | conns | req/s | p50 ms | p99 ms | non-2xx | socket err | mean batch "
            "| CPU µs/req server | CPU µs/req all |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, data in by_contender.items():
            if "levels" not in data:
                lines.append(f"| {name} | — | {data.get('skipped', 'not run')} | | | | | | | |")
                continue
            for row in data["levels"]:
                lines.append(
                    f"| {name} | {row['connections']} | {row['req_per_s']:.0f} | "
                    f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['non2xx']} | "
                    f"{row['socket_errors']} | {fmt(row['mean_batch'])} | "
                    f"{fmt(row.get('server_cpu_us'))} | {fmt(row.get('all_cpu_us'))} |"
                )
        lines.append("")
        correct = {
            name: data["correctness"]
            for name, data in by_contender.items()
            if "correctness" in data
        }
        lines += [f"Correctness pass: {json.dumps(correct)}", ""]
        if workload in report.get("bare_model_ms", {}):
            added = report["added_ms"].get(workload, {})
            lines += [
                f"Bare model call on one item, in the benchmark's process (median of 200): "
                f"{report['bare_model_ms'][workload]:.2f} ms. Added at 1 connection (p50 less "
                "that): " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in added.items()),
                "",
            ]
        for key, by_level in report["ratios"].get(workload, {}).items():
            text = ", ".join(f"{c}: {r:.2f}" for c, r in by_level.items())
            pair = key if " / " in key else f"microbatch / {key}"
            lines.append(f"- {pair} (req/s): {text}")
        lines.append("")
    lines += ["## What each contender got", ""]
    for name, info in report["contenders"].items():
        lines.append(f"- **{name}**: {info['settings']} ({info['versions']})")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> bool:
    """Throughput and p99 vs connections, one column per workload; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)
        return False
    workloads = list(report["results"])
    figure, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 8), squeeze=False)
    for column, workload in enumerate(workloads):
        for name, data in report["results"][workload].items():
            if "levels" not in data:
                continue
            conns = [row["connections"] for row in data["levels"]]
            axes[0][column].plot(
                conns, [row["req_per_s"] for row in data["levels"]], "o-", label=name
            )
            axes[1][column].plot(conns, [row["p99_ms"] for row in data["levels"]], "o-", label=name)
        axes[0][column].set_title(f"{workload}: throughput")
        axes[0][column].set_ylabel("requests/s")
        axes[1][column].set_title(f"{workload}: p99 latency")
        axes[1][column].set_ylabel("ms")
        axes[1][column].set_yscale("log")
        for row_axes in axes:
            row_axes[column].set_xscale("log", base=2)
            row_axes[column].set_xlabel("connections")
            row_axes[column].legend()
            row_axes[column].grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True
