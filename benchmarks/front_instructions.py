"""Machine instructions per request of the front, counted by valgrind: a figure the
shared machine's noise does not move, to tell a change of 1-2 % in the front's CPU.

CPU time per request moves by up to 2x between runs here, and even
``front_cpu.py``'s in-process figure spreads by ±20 %. This runs ``front_cpu.py``'s
child (closed-loop clients over fake transports, through the connection layer and a
real :class:`~microbatch.Service` with a thread stage) under ``valgrind
--tool=callgrind`` twice, with ``--small`` and ``--large`` requests, and divides the
difference of the two instruction counts by the difference of the requests, so the
start-up (imports, the service's start) drops out. Threads take turns in a fixed
order (``--fair-sched=yes``), so the batches vary little: the same code counted
twice gave figures 0.1 % apart on a quiet machine and up to 2 % apart on a busy one
(the batcher's timers still follow the clock).

With ``--profile N``, the N compiled functions of microbatch that cost the most per
request (inclusive, the larger run less the smaller) are listed too.

Run (valgrind: ``apt-get install -y valgrind``; about a minute a tree)::

    python benchmarks/front_instructions.py --before-src /tmp/before/src

Compare compiled trees (``benchmarks/compiled_tree.py``, then ``--src`` and
``--before-src``) to measure the wheel users get; this checkout's ``src/`` is pure
Python.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONT_CPU = Path(__file__).resolve().parent / "front_cpu.py"
_COLLECTED = re.compile(r"Collected : (\d+)")
_ROW = re.compile(r"\s*([\d,]+) \([^)]*\)\s+(?:\S+?:)?(\S+)")


def count(src: Path, requests: int, out: Path) -> int:
    """Instructions of one run of ``requests`` requests (after as many warming up)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    # --fair-sched: the loop's and the stage thread's turns come in a fixed order, so
    # the batches (and the count) come out the same from run to run.
    command = ["valgrind", "--tool=callgrind", "--fair-sched=yes", f"--callgrind-out-file={out}"]
    command += [sys.executable, str(FRONT_CPU), "--child", "--requests", str(requests)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def inclusive(out: Path) -> dict[str, int]:
    """Inclusive instructions per function of one callgrind output."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    costs: dict[str, int] = {}
    for line in text.splitlines():
        row = _ROW.match(line)
        if row is not None:
            name = row.group(2)
            costs[name] = costs.get(name, 0) + int(row.group(1).replace(",", ""))
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-src", type=Path, help="also count this source tree")
    parser.add_argument(
        "--src", type=Path, default=ROOT / "src", help="the tree to count (default: this one's)"
    )
    parser.add_argument("--small", type=int, default=5_000, help="requests of the first run")
    parser.add_argument("--large", type=int, default=15_000, help="requests of the second run")
    parser.add_argument("--profile", type=int, default=0, help="list this many functions")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install -y valgrind)")
    trees = {"this checkout": args.src.resolve()}
    if args.before_src is not None:
        trees = {"before": args.before_src.resolve(), **trees}
    # Each run answers its requests twice (a warm-up, then the measured run).
    extra = 2 * (args.large - args.small)
    with tempfile.TemporaryDirectory() as work:
        for name, src in trees.items():
            small, large = Path(work) / "small.out", Path(work) / "large.out"
            per_request = (count(src, args.large, large) - count(src, args.small, small)) / extra
            print(f"{name}: {per_request:,.0f} instructions per request", flush=True)
            if args.profile:
                before, after = inclusive(small), inclusive(large)
                compiled = [f for f in after if f.startswith("CPyDef_")]
                ranked = sorted(compiled, key=lambda f: before.get(f, 0) - after[f])
                for function in ranked[: args.profile]:
                    cost = (after[function] - before.get(function, 0)) / extra
                    print(f"  {cost:9,.0f}  {function.removeprefix('CPyDef_')}")


if __name__ == "__main__":
    main()
