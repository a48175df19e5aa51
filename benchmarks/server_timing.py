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
run time, in nanoseconds) before and after, and divides by the requests answered;
it also reads the batches each server released (``/metrics``), since a batch's
fixed cost is shared by its items and the two must batch alike to compare.
Each pair of rounds gives one on/off ratio; the report is their median and spread
(quartiles, min, max), and the pooled ratio over all rounds.

``--pin`` puts both serving processes on one CPU and everything else of the run
(``wrk``, the model workers) on the others, so that the two share a CPU alike and
are not slowed by their own load generator; ``--sessions N`` starts fresh pairs of
servers N times (the first started alternating): one process can be a few percent
dearer than another running the same code, for its whole life.

Run from the repository root (the servers import this checkout's ``src/``)::

    flock /work/bench.lock python benchmarks/server_timing.py --together --pin \
        --sessions 4 --pairs 10 --seconds 1
    flock /work/bench.lock python benchmarks/server_timing.py --together --pin \
        --sessions 4 --pairs 10 --seconds 1 --aa --name server_timing_aa
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, SERVERS, SINGLE_THREAD_BLAS, machine, run_wrk, serving
from http_serving import MICROBATCH, lua_script

Round = tuple[float, int, float]
"""One server's round: its CPU seconds, the requests answered, the batches released."""


def serving_cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU so far of every thread of process ``pid`` (``schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended: its time is lost to both alike
    return total


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (its model workers), and theirs."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *children(int(child))]
    return found


def pin(pids: list[int]) -> None:
    """Every serving process's threads on the first CPU, everything else of this run
    (this process, so the ``wrk`` runs, and the servers' model workers) on the
    others: the two serving processes share one CPU alike, and whatever else of this
    run happens does not fall on it."""
    first, *others = sorted(os.sched_getaffinity(0))
    rest = set(others) or {first}
    os.sched_setaffinity(0, rest)
    for pid in pids:
        for child in children(pid):
            for task in Path(f"/proc/{child}/task").iterdir():
                os.sched_setaffinity(int(task.name), rest)
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), {first})


def batches_so_far(base: str) -> float:
    """The batches the server released so far (``microbatch_batches_total`` in its
    ``/metrics``, summed over its stages)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("microbatch_batches_total")
    )


def one_round(
    pid: int, url: str, script: Path, connections: int, seconds: float
) -> tuple[float, int, float]:
    """One closed-loop run: the serving process's CPU seconds, the requests, and
    the batches released (read outside the CPU window: the scrape costs CPU too)."""
    base = url.rsplit("/", 1)[0]
    batches = batches_so_far(base)
    before = serving_cpu_ns(pid)
    summary = run_wrk(url, script, connections, seconds)
    after = serving_cpu_ns(pid)
    batches = batches_so_far(base) - batches
    if summary["non2xx"] or summary["timeout"]:
        raise RuntimeError(f"errors in a round: {summary}")
    return (after - before) / 1e9, int(summary["requests"]), batches


def both_at_once(
    pids: dict[str, int], urls: dict[str, str], script: Path, connections: int, seconds: float
) -> dict[str, Round]:
    """One round that loads both servers at the same time (one ``wrk`` each), so that
    whatever else the machine does in that second falls on both."""
    with ThreadPoolExecutor(len(pids)) as pool:
        runs = {
            label: pool.submit(one_round, pids[label], urls[label], script, connections, seconds)
            for label in pids
        }
        return {label: run.result() for label, run in runs.items()}


def report_pair(pair: int, rounds: dict[str, list[Round]]) -> None:
    """Print the last pair of rounds."""
    on, off = rounds["on"][-1], rounds["off"][-1]
    print(
        f"pair {pair + 1:2d}: on {1e6 * on[0] / on[1]:6.1f} µs/req ({on[1]} req, "
        f"{on[1] / max(on[2], 1):.2f}/batch), off {1e6 * off[0] / off[1]:6.1f} µs/req "
        f"({off[1]} req, {off[1] / max(off[2], 1):.2f}/batch)",
        flush=True,
    )


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """The 25th, 50th and 75th percentiles."""
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def run_session(
    args: argparse.Namespace, env: dict[str, str], contender: Any, off_first: bool
) -> dict[str, list[Round]]:
    """Start the two servers, warm them up, and run ``args.pairs`` pairs of rounds."""
    rounds: dict[str, list[Round]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        directory = Path(scratch)
        script = lua_script(args.workload, directory)
        servers = {}
        on_options: tuple[str, ...] = ("--no-server-timing",) if args.aa else ()
        kinds = [("on", on_options), ("off", ("--no-server-timing",))]
        if off_first:  # which one starts first is the other difference between them
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
        if args.pin:
            pin(list(pids.values()))
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
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=16, help="pairs of rounds a session")
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
        "--sessions",
        type=int,
        default=1,
        help="fresh pairs of servers, one after the other (the first started alternates)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the serving processes on the first CPU, wrk and the model workers on the "
        "others (see pin())",
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
    rounds: dict[str, list[Round]] = {"on": [], "off": []}
    session_of_pair: list[int] = []
    for session in range(args.sessions):
        # fresh processes each session (a process's own layout costs it a few percent,
        # as one A/A session can show), the first started alternating between them
        off_first = args.off_first != (session % 2 == 1)
        for label, done in run_session(args, env, contender, off_first).items():
            rounds[label] += done
        session_of_pair += [session] * args.pairs
    per_request = {
        label: [cpu / requests for cpu, requests, _ in done] for label, done in rounds.items()
    }
    per_batch = {
        label: sum(requests for _, requests, _ in done) / sum(batches for _, _, batches in done)
        for label, done in rounds.items()
    }
    ratios = [on / off for on, off in zip(per_request["on"], per_request["off"], strict=True)]
    pooled = {
        label: sum(cpu for cpu, _, _ in done) / sum(requests for _, requests, _ in done)
        for label, done in rounds.items()
    }
    low, median, high = quartiles(ratios)
    by_session = [
        statistics.median(r for r, at in zip(ratios, session_of_pair, strict=True) if at == session)
        for session in range(args.sessions)
    ]
    report: dict[str, Any] = {
        "machine": machine(),
        "method": (
            "two servers side by side, "
            + (
                "both loaded at once in each round"
                if args.together
                else "load to one at a time, ABBA rounds"
            )
            + (
                "; serving processes pinned to one CPU, wrk and the model workers to the other"
                if args.pin
                else ""
            )
            + f"; {args.sessions} session(s) of fresh servers, the first started alternating"
            + "; CPU of the serving process from /proc/PID/task/*/schedstat per round"
        ),
        "workload": args.workload,
        "aa": args.aa,
        "pinned": args.pin,
        "sessions": args.sessions,
        "session_of_pair": session_of_pair,
        "ratio_median_per_session": by_session,
        "off_first": args.off_first,
        "connections": args.connections,
        "seconds_per_round": args.seconds,
        "pairs": args.pairs,
        "cpu_us_per_request": {
            label: [1e6 * value for value in values] for label, values in per_request.items()
        },
        "requests_per_round": {
            label: [requests for _, requests, _ in done] for label, done in rounds.items()
        },
        "items_per_batch": {
            label: [requests / max(batches, 1) for _, requests, batches in done]
            for label, done in rounds.items()
        },
        "ratio_median": median,
        "ratio_quartiles": [low, high],
        "ratio_min_max": [min(ratios), max(ratios)],
        "ratio_pooled": pooled["on"] / pooled["off"],
        "pooled_cpu_us_per_request": {label: 1e6 * value for label, value in pooled.items()},
        "pooled_items_per_batch": per_batch,
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
        + (
            "The two serving processes pinned to one CPU (they share it alike), `wrk` and "
            "the model workers to the other. "
            if args.pin
            else ""
        )
        + f"{args.sessions} session(s), each with two fresh server processes (the first "
        "started alternating). CPU: the serving process's threads' run time "
        "(`/proc/PID/task/*/schedstat`) per request answered.",
        "",
        f"- on/off ratio per pair: **median {median:.3f}**, quartiles {low:.3f} to {high:.3f}, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f}",
        "- median per session: " + ", ".join(f"{value:.3f}" for value in by_session),
        f"- pooled over all rounds: on {1e6 * pooled['on']:.1f} µs/request, off "
        f"{1e6 * pooled['off']:.1f} µs/request, ratio {report['ratio_pooled']:.3f}",
        f"- items per batch: on {per_batch['on']:.2f}, off {per_batch['off']:.2f} "
        "(a batch's fixed cost is shared by its items: the two servers must batch alike)",
        "",
        "| session | pair | on µs/req | off µs/req | ratio | on req | off req | on /batch "
        "| off /batch |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for index, ratio in enumerate(ratios):
        on_us, off_us = 1e6 * per_request["on"][index], 1e6 * per_request["off"][index]
        (_, on_n, on_b), (_, off_n, off_b) = rounds["on"][index], rounds["off"][index]
        lines.append(
            f"| {session_of_pair[index] + 1} | {index % args.pairs + 1} | {on_us:.1f} "
            f"| {off_us:.1f} | {ratio:.3f} | {on_n} | {off_n} "
            f"| {on_n / max(on_b, 1):.2f} | {off_n / max(off_b, 1):.2f} |"
        )
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:9]))


if __name__ == "__main__":
    main()
