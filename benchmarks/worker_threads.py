"""The math libraries' threads (``pipeline/worker_env.py``), served as a user starts
the server: no ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS``
in its environment.

*scalar numpy* (``benchmarks/http_serving.py``'s workload: one ``(n x 256) @
(256 x 256)`` layer per batch), in a worker process (``microbatch_server:service``)
and in the serving process (``microbatch_server:predict``, a ``@batch`` function
calling numpy in a thread), wrk at ``--connections`` (64), for ``--seconds`` per
round, ``--rounds`` rounds with the servers in turn (all of them up at once, so that
they share the same minutes of a shared machine), each of these for both:

* ``this checkout``: the server as a user starts it (no thread variable set);
* ``this checkout, BLAS on 1 thread``: the variables set to 1, as every other
  benchmark here sets them (the reference);
* ``before`` (with ``--before-src DIR``, a checkout's ``src/`` first on
  ``PYTHONPATH``): the code before, started as a user starts it.

Reported: each server's requests per second and its serving process's CPU time per
request (user + system, ``/proc``), medians over the rounds.

Run: ``python benchmarks/worker_threads.py [--before-src /tmp/before/src]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SINGLE_THREAD_BLAS, ensure_venv, process_cpu_s, run_wrk, serving
from http_serving import MICROBATCH, lua_script

KINDS = {
    "worker process": MICROBATCH,
    "serving process": replace(MICROBATCH, server="microbatch_server:predict"),
}

THREAD_VARIABLES = (*SINGLE_THREAD_BLAS, "VECLIB_MAXIMUM_THREADS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-src", type=Path, help="also serve this checkout's src/")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    for name in THREAD_VARIABLES:  # as a user starts it: none of them set
        os.environ.pop(name, None)
    workload = {"BENCH_WORKLOAD": "scalar"}
    settings = {
        "this checkout": workload,
        "this checkout, BLAS on 1 thread": {**workload, **SINGLE_THREAD_BLAS},
    }
    if args.before_src is not None:
        settings["before"] = {**workload, "PYTHONPATH": str(args.before_src.resolve())}
    ensure_venv(MICROBATCH)
    variants = {(kind, name): env for kind in KINDS for name, env in settings.items()}
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in variants}
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as servers:
        logs = Path(scratch)
        running = {
            key: servers.enter_context(serving(KINDS[key[0]], env, logs / f"{i}.log"))
            for i, (key, env) in enumerate(variants.items())
        }
        script = lua_script("scalar", logs)
        for server in running.values():  # warm-up
            run_wrk(server.base + MICROBATCH.predict_path, script, args.connections, 1.0)
        for round_ in range(args.rounds):
            order = list(running) if round_ % 2 == 0 else list(reversed(running))
            for key in order:
                server = running[key]
                before = process_cpu_s(server.process.pid)
                url = server.base + MICROBATCH.predict_path
                summary = run_wrk(url, script, args.connections, args.seconds)
                cpu = process_cpu_s(server.process.pid) - before
                requests = summary["requests"]
                rate = requests / (summary["duration_us"] / 1e6)
                per_request = 1e6 * cpu / max(1, requests)
                figures[key].append((rate, per_request))
                label = f"{key[0]}: {key[1]}"
                print(f"{label:50} {rate:9.0f} req/s  {per_request:5.1f} µs/req", flush=True)
    print()
    print(
        f"| model in the | server ({args.connections} connections) | req/s, median (each round)"
        " | serving CPU µs/req |"
    )
    print("|---|---|---|---:|")
    for (kind, name), rounds in figures.items():
        rates = ", ".join(f"{rate:.0f}" for rate, _ in rounds)
        median_rate = statistics.median(rate for rate, _ in rounds)
        median_cpu = statistics.median(cpu for _, cpu in rounds)
        print(f"| {kind} | {name} | {median_rate:.0f} ({rates}) | {median_cpu:.1f} |")


if __name__ == "__main__":
    main()
