"""The CPU cost of ``Server-Timing`` (issue 19: the hot path's CPU per request with it
on within 5% of off), measured so that the machine's noise cancels out.

Two ``microbatch serve`` processes of the same service run side by side, one with
``Server-Timing`` on (the default) and one with ``--no-server-timing`` (``--aa``:
both off, to see the method's own spread). ``wrk`` (closed loop, a workload of
``http_serving.py``: ``sim`` by default, where the model's time, not the machine's
load, sets the batches) loads them in many short rounds: both at once in each
round (``--together``: whatever else the machine does in that second falls on
both), or one at a time in ABBA order (on, off, off, on, ...). Each round reads the
serving process's CPU time from ``/proc`` (the sum of its threads' ``schedstat``
run time, in nanoseconds) before and after, and divides by the requests answered.
Each pair of rounds gives one on/off ratio; the report is their median and spread
(quartiles, min, max), and the pooled ratio over all rounds.

Run from the repository root (the servers import this checkout's ``src/``)::

    flock /work/bench.lock python benchmarks/server_timing.py --together --pairs 40 --seconds 1
    flock /work/bench.lock python benchmarks/server_timing.py --together --pairs 40 --seconds 1 \
        --aa --name server_timing_aa
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, SERVERS, SINGLE_THREAD_BLAS, machine, run_wrk, serving
from http_serving import MICROBATCH, lua_script


def serving_cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU so far of every thread of process ``pid`` (``schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended: its time is lost to both alike
    return total


def one_round(
    pid: int, url: str, script: Path, connections: int, seconds: float
) -> tuple[float, int]:
    """One closed-loop run: the serving process's CPU seconds and the requests."""
    before = serving_cpu_ns(pid)
    summary = run_wrk(url, script, connections, seconds)
    after = serving_cpu_ns(pid)
    if summary["non2xx"] or summary["timeout"]:
        raise RuntimeError(f"errors in a round: {summary}")
    return (after - before) / 1e9, int(summary["requests"])


def both_at_once(
    pids: dict[str, int], urls: dict[str, str], script: Path, connections: int, seconds: float
) -> dict[str, tuple[float, int]]:
    """One round that loads both servers at the same time (one ``wrk`` each), so that
    whatever else the machine does in that second falls on both."""
    with ThreadPoolExecutor(len(pids)) as pool:
        runs = {
            label: pool.submit(one_round, pids[label], urls[label], script, connections, seconds)
            for label in pids
        }
        return {label: run.result() for label, run in runs.items()}


def report_pair(pair: int, rounds: dict[str, list[tuple[float, int]]]) -> None:
    """Print the last pair of rounds."""
    on, off = rounds["on"][-1], rounds["off"][-1]
    print(
        f"pair {pair + 1:2d}: on {1e6 * on[0] / on[1]:6.1f} µs/req ({on[1]} req), "
        f"off {1e6 * off[0] / off[1]:6.1f} µs/req ({off[1]} req)",
        flush=True,
    )


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """The 25th, 50th and 75th percentiles."""
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=16, help="ABBA pairs of rounds")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per round")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds, each server")
    parser.add_argument("--name", default="server_timing", help="results file name")
    parser.add_argument(
        "--workload",
        default="sim",
        choices=["sim", "scalar"],
        help="http_serving.py's workload (sim: the model's time sets the batches)",
    )
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument(
        "--aa",
        action="store_true",
        help="an A/A run: both servers without Server-Timing (the method's own spread)",
    )
    parser.add_argument(
        "--off-first",
        action="store_true",
        help="start the server without Server-Timing first (run both orders: the first "
        "started may differ a little, as the A/A run shows)",
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="load both servers at once in each round (else one at a time, ABBA)",
    )
    args = parser.parse_args()
    python_path = os.pathsep.join([str(ROOT / "src"), str(SERVERS)])
    contender = replace(MICROBATCH, venv_name=sys.prefix)  # this interpreter's env
    env = {**SINGLE_THREAD_BLAS, "PYTHONPATH": python_path, "BENCH_WORKLOAD": args.workload}
    rounds: dict[str, list[tuple[float, int]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        directory = Path(scratch)
        script = lua_script(args.workload, directory)
        servers = {}
        on_options: tuple[str, ...] = ("--no-server-timing",) if args.aa else ()
        kinds = [("on", on_options), ("off", ("--no-server-timing",))]
        if args.off_first:  # which one starts first is the other difference between them
            kinds.reverse()
        for label, options in kinds:
            counter = directory / f"{label}.counter"
            running = stack.enter_context(
                serving(
                    replace(contender, options=options),
                    {**env, "BENCH_COUNTER_FILE": str(counter)},
                    directory / f"{label}.log",
                )
            )
            servers[label] = running
        urls = {label: running.base + "/predict" for label, running in servers.items()}
        for label in servers:
            run_wrk(urls[label], script, args.connections, args.warmup)
        pids = {label: running.process.pid for label, running in servers.items()}
        for pair in range(args.pairs):
            if args.together:
                for label, done in both_at_once(
                    pids, urls, script, args.connections, args.seconds
                ).items():
                    rounds[label].append(done)
                report_pair(pair, rounds)
                continue
            order = ("on", "off") if pair % 2 == 0 else ("off", "on")  # ABBA
            for label in order:
                rounds[label].append(
                    one_round(pids[label], urls[label], script, args.connections, args.seconds)
                )
            report_pair(pair, rounds)
    per_request = {
        label: [cpu / requests for cpu, requests in done] for label, done in rounds.items()
    }
    ratios = [on / off for on, off in zip(per_request["on"], per_request["off"], strict=True)]
    pooled = {
        label: sum(cpu for cpu, _ in done) / sum(requests for _, requests in done)
        for label, done in rounds.items()
    }
    low, median, high = quartiles(ratios)
    report: dict[str, Any] = {
        "machine": machine(),
        "method": (
            "two servers side by side, "
            + (
                "both loaded at once in each round"
                if args.together
                else "load to one at a time, ABBA rounds"
            )
            + "; CPU of the serving process from /proc/PID/task/*/schedstat per round"
        ),
        "workload": args.workload,
        "aa": args.aa,
        "off_first": args.off_first,
        "connections": args.connections,
        "seconds_per_round": args.seconds,
        "pairs": args.pairs,
        "cpu_us_per_request": {
            label: [1e6 * value for value in values] for label, values in per_request.items()
        },
        "requests_per_round": {
            label: [requests for _, requests in done] for label, done in rounds.items()
        },
        "ratio_median": median,
        "ratio_quartiles": [low, high],
        "ratio_min_max": [min(ratios), max(ratios)],
        "ratio_pooled": pooled["on"] / pooled["off"],
        "pooled_cpu_us_per_request": {label: 1e6 * value for label, value in pooled.items()},
    }
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    command = " ".join(["python", "benchmarks/server_timing.py", *sys.argv[1:]])
    lines = [
        "# Server-Timing: CPU per request, on against off",
        "",
        f"{report['machine']}; `{command}`.",
        f"Two `microbatch serve` processes (the `{args.workload}` workload of "
        "`http_serving.py`: one "
        f"process stage, max batch 64), one with `--no-server-timing`; `wrk` with "
        f"{args.connections} connections to each, "
        + (
            f"both at once, in {args.pairs} rounds of {args.seconds:g} s. "
            if args.together
            else f"one at a time, {args.pairs} ABBA pairs of {args.seconds:g} s rounds. "
        )
        + "CPU: the serving process's threads' run time "
        "(`/proc/PID/task/*/schedstat`) per request answered.",
        "",
        f"- on/off ratio per pair: **median {median:.3f}**, quartiles {low:.3f} to {high:.3f}, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f}",
        f"- pooled over all rounds: on {1e6 * pooled['on']:.1f} µs/request, off "
        f"{1e6 * pooled['off']:.1f} µs/request, ratio {report['ratio_pooled']:.3f}",
        "",
        "| pair | on µs/req | off µs/req | ratio | on req | off req |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for index, ratio in enumerate(ratios):
        on_us, off_us = 1e6 * per_request["on"][index], 1e6 * per_request["off"][index]
        on_n, off_n = rounds["on"][index][1], rounds["off"][index][1]
        lines.append(
            f"| {index + 1} | {on_us:.1f} | {off_us:.1f} | {ratio:.3f} | {on_n} | {off_n} |"
        )
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:7]))


if __name__ == "__main__":
    main()
