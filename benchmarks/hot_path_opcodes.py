"""Python opcodes per request in the serving process: a measure of the front's work
per request that the machine's noise does not move.

CPU time per request (``benchmarks/http_serving.py``) moved by up to 2x between runs
of the same code on this shared machine, so a change of 5 % in the front's work
cannot be seen there. This counts instead the Python opcodes the serving thread
runs (``servers/opcode_counting.py``: a trace function, so the server runs about
50x slower while counting; the count does not depend on the speed) while ``wrk``
sends *scalar* requests (``{"x": float}``, one process worker, max batch 64) at
``--connections``, divided by the requests the server answered meanwhile (its
``/metrics``). Per-batch work is included, spread over the batch's requests: the
batch sizes are those of the slowed-down server, so compare runs at one setting.

With ``--before-src DIR`` (a ``git archive`` of an earlier commit's ``src``) that
tree is counted too, and the report gives both side by side.

Run: ``python benchmarks/hot_path_opcodes.py [--before-src /tmp/before/src]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "servers"))
from counter import read_counter

from harness import LUA_DONE, RESULTS, ROOT, SINGLE_THREAD_BLAS, metrics_text, run_wrk, serving
from http_serving import LUA_SIM

_SERVED = re.compile(r'microbatch_http_requests_total\{route="/predict",status="200"\} (\S+)')


@dataclass(frozen=True)
class CountingServer:
    """``microbatch serve`` of the *scalar* workload under the opcode counter (what
    :func:`harness.serving` needs of a contender)."""

    framework: str = "microbatch"
    health_path: str = "/health/ready"

    def command(self, port: int) -> list[str]:
        """Its argv (it announces the port it got)."""
        return [
            sys.executable,
            "opcode_counting.py",
            "serve",
            "microbatch_server:service",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-level",
            "warning",
        ]


def served(base: str) -> int:
    """Requests to ``/predict`` answered 200 so far."""
    found = _SERVED.search(metrics_text(base))
    return int(float(found.group(1))) if found else 0


@dataclass(frozen=True)
class Counted:
    """One tree's count: opcodes per function, requests answered and batches run."""

    opcodes: Counter[str]
    requests: int
    batches: int


def count(src: Path, connections: int, seconds: float, work: Path) -> Counted:
    """Opcodes per function while ``wrk`` runs, and the requests and batches meanwhile."""
    counts_file = work / "counts.json"
    counts_file.unlink(missing_ok=True)
    env = {
        **SINGLE_THREAD_BLAS,
        "BENCH_WORKLOAD": "scalar",
        "BENCH_COUNTER_FILE": str(work / "batches"),
        "OPCODE_COUNTS_FILE": str(counts_file),
        "PYTHONPATH": str(src),
    }
    script = work / "scalar.lua"
    script.write_text(LUA_SIM + LUA_DONE)
    with serving(CountingServer(), env, work / "server.log") as running:  # type: ignore[arg-type]
        url = running.base + "/predict"
        run_wrk(url, script, connections, 1.0)  # warm-up, not counted
        before = served(running.base)
        batches_before, _ = read_counter(env["BENCH_COUNTER_FILE"])
        os.kill(running.process.pid, signal.SIGUSR1)
        run_wrk(url, script, connections, seconds)
        time.sleep(1.0)  # the last requests wrk gave up on are answered
        os.kill(running.process.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not counts_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        requests = served(running.base) - before
        batches = read_counter(env["BENCH_COUNTER_FILE"])[0] - batches_before
    return Counted(Counter(json.loads(counts_file.read_text())), requests, batches)


def by_module(counts: Counter[str]) -> Counter[str]:
    """The counts summed per source file."""
    modules: Counter[str] = Counter()
    for key, opcodes in counts.items():
        modules[key.split(":", 1)[0]] += opcodes
    return modules


def report(runs: dict[str, Counted], top: int) -> str:
    """Markdown: totals, per module and the busiest functions, per request (a column
    per run: ``TREE @ CONNECTIONS``)."""
    names = list(runs)
    per = {
        name: {k: v / max(1, r.requests) for k, v in r.opcodes.items()} for name, r in runs.items()
    }
    modules = {name: by_module(r.opcodes) for name, r in runs.items()}
    head = "| " + " | ".join(names) + " |"
    rule = "|---" + "|---:" * len(names) + "|"
    lines = [
        "# Python opcodes per request in the serving process (`benchmarks/hot_path_opcodes.py`)",
        "",
        "*scalar* workload driven by wrk (a column per source tree and number of"
        " connections), one process worker, max batch 64. The batches of the slowed-down"
        " server vary from run to run at 64 connections (see *mean batch*), and with"
        " them the per-batch share; at 1 connection every batch holds one request.",
        "",
        "| | " + " | ".join(names) + " |",
        rule,
        "| requests counted | " + " | ".join(str(runs[n].requests) for n in names) + " |",
        "| mean batch | "
        + " | ".join(f"{runs[n].requests / max(1, runs[n].batches):.1f}" for n in names)
        + " |",
        "| **opcodes per request** | "
        + " | ".join(f"**{sum(per[n].values()):.0f}**" for n in names)
        + " |",
        "",
        "## Per module",
        "",
        "| module " + head,
        rule,
    ]
    last = names[-1]
    for module, _ in modules[last].most_common():
        cells = [f"{modules[n][module] / max(1, runs[n].requests):.1f}" for n in names]
        if max(float(cell) for cell in cells) >= 1.0:
            lines.append(f"| `{module}` | " + " | ".join(cells) + " |")
    lines += ["", f"## The {top} busiest functions ({last})", "", "| function " + head, rule]
    for key, _ in Counter(per[last]).most_common(top):
        cells = " | ".join(f"{per[n].get(key, 0.0):.1f}" for n in names)
        lines.append(f"| `{key}` | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--seconds", type=float, default=3.0, help="counted wrk run")
    parser.add_argument("--before-src", type=Path, help="also count this source tree")
    parser.add_argument("--top", type=int, default=30, help="functions listed")
    parser.add_argument("--name", default="hot_path_opcodes", help="results/NAME.md and .json")
    args = parser.parse_args()
    trees = {"this checkout": ROOT / "src"}
    if args.before_src is not None:
        trees = {"before": args.before_src.resolve(), **trees}
    runs = {}
    with tempfile.TemporaryDirectory() as work:
        for connections in args.connections:
            for name, src in trees.items():
                key = f"{name} @ {connections}"
                done = runs[key] = count(src, connections, args.seconds, Path(work))
                total = sum(done.opcodes.values()) / max(1, done.requests)
                print(
                    f"{key}: {done.requests} requests in {done.batches} batches,"
                    f" {total:.0f} opcodes per request",
                    flush=True,
                )
    text = report(runs, args.top)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.md").write_text(text + "\n")
    payload = {
        name: {"requests": r.requests, "batches": r.batches, "opcodes": dict(r.opcodes)}
        for name, r in runs.items()
    }
    (RESULTS / f"{args.name}.json").write_text(json.dumps(payload))
    print(text)


if __name__ == "__main__":
    main()
