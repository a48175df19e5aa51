"""Scale-out on Ray Serve (issue 7): microbatch inside the replicas vs ``@serve.batch``.

One command, from the repository root, in an environment with ``microbatch[ray]``::

    .venv/bin/python benchmarks/ray_serving.py                    # ~7 min
    .venv/bin/python benchmarks/ray_serving.py --duration 3 --warmup 1 --levels 64   # quick

Needs ``wrk`` (``apt-get install -y wrk``). Starts a local Ray instance (``--num-cpus``,
default 2; no dashboard) with Ray Serve's HTTP proxy on a free port of 127.0.0.1, and
deploys each contender in turn as the only application:

* microbatch: ``benchmarks/servers/ray_apps.py:service`` through
  ``microbatch.ray.application`` -- stages in threads of the replica (the default),
  and in worker processes (``stage_mode="process"``) to measure that choice;
* Ray Serve's ``@serve.batch`` with the same settings (max batch 64, 10 ms wait, one
  batch at a time), and the same ``max_ongoing_requests`` as microbatch gets, so that
  Ray does not cap its batches; and once with Ray's default ``max_ongoing_requests``
  (5), which is what a deployment gets unless told otherwise.

Each at 1 and 2 replicas (1 CPU each), checked for correctness (concurrent distinct
inputs, every ``y == 2x``), then driven through the proxy by ``wrk`` in closed loop at
each connection level (warm-up, then the measured run; the wrk script and runner are
``benchmarks/http_serving.py``'s). The model is the simulated accelerator of
``benchmarks/servers/workloads.py`` (``sleep(2 ms + 20 us x batch)``); each replica
counts its batches (mean batch size). During every measured run the CPU time of each
process is read from ``/proc``: where the time goes (proxy, replicas, wrk, the rest
of Ray), in cores.

Writes ``benchmarks/results/ray.json`` and ``ray.md``. The machine is shared: compare
ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import serve

import http_serving
from harness import (
    RESULTS,
    ROOT,
    SERVERS,
    cpu_s_below,
    fmt,
    free_port,
    machine,
    post_json,
    run_wrk,
    wrk_row,
)

sys.path.insert(0, str(SERVERS))

from workloads import MAX_BATCH, MAX_WAIT_MS, read_counter

import microbatch
import microbatch.ray

LEVELS = [16, 64, 256]
HAPROXY_FLAG = "RAY_SERVE_ENABLE_HA_PROXY"
PROXIES = {
    "ray": "Ray Serve's default HTTP proxy (a Python actor per node)",
    "haproxy": f"Ray Serve's HAProxy-based ingress ({HAPROXY_FLAG}=1, experimental in Ray 2.60)",
}
APP = "bench"


@dataclass(frozen=True)
class Contender:
    """One deployment under test."""

    name: str
    replicas: int
    make: Callable[[int, int], Any]  # (replicas, max_ongoing_requests) -> Application
    max_ongoing_requests: int | None = None  # None: what microbatch gives its replicas
    settings: str = ""


def microbatch_app(stage_mode: microbatch.ray.StageMode) -> Callable[[int, int], Any]:
    def make(replicas: int, max_ongoing: int) -> Any:
        import ray_apps

        return microbatch.ray.application(
            ray_apps.service,
            num_replicas=replicas,
            num_cpus=1,
            stage_mode=stage_mode,
            max_ongoing_requests=max_ongoing,
        )

    return make


def serve_batch_app(replicas: int, max_ongoing: int) -> Any:
    import ray_apps

    options: dict[str, Any] = {"num_replicas": replicas, "ray_actor_options": {"num_cpus": 1}}
    if max_ongoing:
        options["max_ongoing_requests"] = max_ongoing
    return serve.deployment(ray_apps.ServeBatched, name="ServeBatched", **options).bind()


def contenders(replica_counts: list[int], max_ongoing: int) -> list[Contender]:
    """Every contender at every replica count (Ray's defaults at the first count only)."""
    out = []
    for replicas in replica_counts:
        out += [
            Contender(
                "microbatch (threads)",
                replicas,
                microbatch_app("thread"),
                settings="Service, 1 Stage (max batch 64, max_latency_ms=10, adaptive), "
                "stage_mode='thread'",
            ),
            Contender(
                "microbatch (processes)",
                replicas,
                microbatch_app("process"),
                settings="the same Service, stage_mode='process' (1 worker process per replica)",
            ),
            Contender(
                "@serve.batch",
                replicas,
                serve_batch_app,
                settings="@serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01), "
                f"max_ongoing_requests={max_ongoing}",
            ),
        ]
    out.append(
        Contender(
            "@serve.batch, Ray defaults",
            replica_counts[0],
            serve_batch_app,
            max_ongoing_requests=0,
            settings="the same, with Ray's default max_ongoing_requests (5)",
        )
    )
    return out


# -- where the time goes ---------------------------------------------------------------


def _role(command: bytes) -> str:
    """Which part of the system a process is, by its command line."""
    if command.startswith(b"wrk"):
        return "wrk"
    if b"ProxyActor" in command or b"haproxy" in command.lower():
        return "proxy"
    if b"ServeReplica" in command:
        return "replicas"
    if b"multiprocessing" in command:
        return "replicas"  # a stage's worker process inside a replica
    return "ray (rest)"


# -- one contender -----------------------------------------------------------------------


@contextmanager
def deployed(contender: Contender, max_ongoing: int) -> Iterator[None]:
    """The contender as the only application; deleted afterwards."""
    given = (
        max_ongoing if contender.max_ongoing_requests is None else contender.max_ongoing_requests
    )
    serve.run(contender.make(contender.replicas, given), name=APP, route_prefix="/")
    try:
        yield
    finally:
        serve.delete(APP)


def check_correct(url: str) -> dict[str, int]:
    """64 concurrent clients, 8 distinct inputs each; every reply must be ``2x``."""

    def client(index: int) -> int:
        wrong = 0
        for j in range(8):
            x = index * 1000 + j + 0.25
            status, data = post_json(url, {"x": x}, timeout_s=30)
            if status != 200 or data.get("y") != 2 * x:
                wrong += 1
        return wrong

    with ThreadPoolExecutor(64) as pool:
        wrong = sum(pool.map(client, range(64)))
    return {"requests": 64 * 8, "wrong": wrong}


def batches_so_far(directory: Path) -> tuple[int, int]:
    batches = items = 0
    for path in directory.glob("*.count"):
        b, i = read_counter(str(path))
        batches, items = batches + b, items + i
    return batches, items


def measure(url: str, script: Path, counters: Path, connections: int, args: Any) -> dict[str, Any]:
    """Warm up, then one measured wrk run; throughput, latency, batches, CPU by role."""
    if args.warmup > 0:
        run_wrk(url, script, connections, args.warmup)
    before_batches, before_cpu = batches_so_far(counters), cpu_s_below(os.getpid(), _role)
    load_before = os.getloadavg()[0]
    # wrk is our child too: its CPU is read from its own rusage below.
    started = time.perf_counter()
    usage_before = os.times()
    summary = run_wrk(url, script, connections, args.duration)
    usage_after = os.times()
    elapsed = time.perf_counter() - started
    after_batches, after_cpu = batches_so_far(counters), cpu_s_below(os.getpid(), _role)
    batches = after_batches[0] - before_batches[0]
    items = after_batches[1] - before_batches[1]
    cores = {
        role: (after_cpu.get(role, 0.0) - before_cpu.get(role, 0.0)) / elapsed
        for role in sorted(set(after_cpu) | set(before_cpu))
    }
    cores["wrk"] = (
        usage_after.children_user
        + usage_after.children_system
        - usage_before.children_user
        - usage_before.children_system
    ) / elapsed
    return {
        "connections": connections,
        **wrk_row(summary),
        "mean_batch": items / batches if batches else None,
        "cores": {role: round(value, 2) for role, value in cores.items()},
        "load_avg_1m_before": load_before,
    }


def bench(contender: Contender, url: str, work: Path, args: Any) -> dict[str, Any]:
    counters = work / "counters"  # every replica counts into its own file here
    script = http_serving.lua_script("sim", work)
    label = f"[{contender.name} x{contender.replicas}]"
    with deployed(contender, args.max_ongoing):
        correctness = check_correct(url)
        print(f"{label} correctness: {correctness}", flush=True)
        rows = []
        for connections in args.levels:
            row = measure(url, script, counters, connections, args)
            rows.append(row)
            print(
                f"{label} c={connections:3d} {row['req_per_s']:7.0f} req/s p50 "
                f"{row['p50_ms']:7.2f} ms p99 {row['p99_ms']:7.2f} ms non2xx {row['non2xx']} "
                f"batch {fmt(row['mean_batch'])} cores {row['cores']}",
                flush=True,
            )
    return {
        "name": contender.name,
        "replicas": contender.replicas,
        "settings": contender.settings,
        "correctness": correctness,
        "levels": rows,
    }


# -- report ------------------------------------------------------------------------------


def _rate(runs: list[dict[str, Any]], name: str, replicas: int, connections: int) -> float | None:
    for run in runs:
        if run["name"] == name and run["replicas"] == replicas:
            for row in run["levels"]:
                if row["connections"] == connections:
                    return float(row["req_per_s"])
    return None


def ratios(runs: list[dict[str, Any]], levels: list[int], counts: list[int]) -> dict[str, Any]:
    """The comparisons the targets are about, per connection level."""
    out: dict[str, Any] = {}

    def add(key: str, top: tuple[str, int], bottom: tuple[str, int]) -> None:
        for connections in levels:
            a, b = _rate(runs, *top, connections), _rate(runs, *bottom, connections)
            if a is not None and b:
                out.setdefault(key, {})[str(connections)] = round(a / b, 2)

    for replicas in counts:
        add(
            f"microbatch (threads) / @serve.batch, {replicas} replica(s)",
            ("microbatch (threads)", replicas),
            ("@serve.batch", replicas),
        )
        add(
            f"threads / processes, {replicas} replica(s)",
            ("microbatch (threads)", replicas),
            ("microbatch (processes)", replicas),
        )
    add(
        "microbatch (threads) / @serve.batch with Ray defaults, 1 replica",
        ("microbatch (threads)", counts[0]),
        ("@serve.batch, Ray defaults", counts[0]),
    )
    if len(counts) > 1:
        for name in ("microbatch (threads)", "microbatch (processes)", "@serve.batch"):
            add(f"{name}: {counts[1]} replicas / {counts[0]}", (name, counts[1]), (name, counts[0]))
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Ray Serve: microbatch inside the replicas vs `@serve.batch`",
        "",
        f"{report['machine']}; Ray {report['ray']}, a local instance with "
        f"{report['num_cpus']} CPUs; wrk closed loop on 127.0.0.1, "
        f"{report['duration_s']:g} s per level after {report['warmup_s']:g} s warm-up. "
        f"Simulated accelerator (sleep 2 ms + 20 us x batch), max batch {MAX_BATCH}, "
        f"wait {MAX_WAIT_MS:g} ms; 1 CPU per replica; max_ongoing_requests "
        f"{report['max_ongoing_requests']} unless said otherwise. The machine is shared "
        "with other work: compare ratios within this run. Cores: CPU time of each part "
        "during the measured run, per second.",
        "",
    ]
    for part in report["proxies"].values():
        lines += [
            f"## {part['proxy']}",
            "",
            "| contender | replicas | conns | req/s | p50 ms | p99 ms | non-2xx | mean batch "
            "| cores: proxy | replicas | wrk | rest of Ray |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for run in part["runs"]:
            for row in run["levels"]:
                cores = row["cores"]
                lines.append(
                    f"| {run['name']} | {run['replicas']} | {row['connections']} | "
                    f"{row['req_per_s']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                    f"{row['non2xx']} | {fmt(row['mean_batch'])} | "
                    f"{cores.get('proxy', 0):.2f} | {cores.get('replicas', 0):.2f} | "
                    f"{cores.get('wrk', 0):.2f} | {cores.get('ray (rest)', 0):.2f} |"
                )
        lines += ["", "Ratios (req/s):", ""]
        for key, by_level in part["ratios"].items():
            text = ", ".join(f"{c} conns: **{r:.2f}**" for c, r in by_level.items())
            lines.append(f"- {key}: {text}")
        correct = {f"{r['name']} x{r['replicas']}": r["correctness"]["wrong"] for r in part["runs"]}
        lines += ["", f"Wrong answers in the correctness pass (512 requests each): {correct}", ""]
    lines += ["## What each contender got", ""]
    seen = set()
    for part in report["proxies"].values():
        for run in part["runs"]:
            if run["name"] not in seen:
                seen.add(run["name"])
                lines.append(f"- **{run['name']}**: {run['settings']}")
    return "\n".join(lines) + "\n"


# -- main --------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", nargs="+", type=int, default=LEVELS, help="connections")
    parser.add_argument("--replicas", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds measured per level")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per level")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument(
        "--max-ongoing",
        type=int,
        default=microbatch.ray.recipe_for(_service()).bound,
        help="max_ongoing_requests of every replica (default: what microbatch.ray gives)",
    )
    parser.add_argument(
        "--only", nargs="+", default=None, help="run only the contenders with these names"
    )
    parser.add_argument(
        "--proxy",
        choices=["both", *PROXIES],
        default="both",
        help="Ray Serve's default proxy, its HAProxy-based one, or both in turn (default)",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--part", type=Path, default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def _service() -> microbatch.Service:
    import ray_apps

    return ray_apps.service


def main() -> None:
    args = parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    os.chdir(ROOT)  # Ray puts the working directory on its workers' path: not benchmarks/
    if args.proxy == "both":
        run_both(args)
        return
    wanted = "1" if args.proxy == "haproxy" else "0"
    if os.environ.get(HAPROXY_FLAG, "0") != wanted:
        # Ray Serve reads the flag when it is imported: start again with it set.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, HAPROXY_FLAG: wanted})
    part = run_one_proxy(args)
    if args.part is not None:
        args.part.write_text(json.dumps(part))
        return
    write_report(args, {args.proxy: part})


def run_both(args: argparse.Namespace) -> None:
    """Each proxy in its own process (Ray Serve reads the proxy flag at import)."""
    parts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ray-parts-") as tmp:
        for proxy in PROXIES:
            part = Path(tmp) / f"{proxy}.json"
            passed = [arg for arg in sys.argv[1:] if arg not in ("--proxy", "both")]
            command = [sys.executable, __file__, *passed, "--proxy", proxy, "--part", str(part)]
            env = {**os.environ, HAPROXY_FLAG: "1" if proxy == "haproxy" else "0"}
            subprocess.run(command, env=env, check=True)
            parts[proxy] = json.loads(part.read_text())
    write_report(args, parts)


def run_one_proxy(args: argparse.Namespace) -> dict[str, Any]:
    """Every contender behind one kind of proxy; the runs and their ratios."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/predict"
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        (Path(tmp) / "counters").mkdir()
        env = {
            "PYTHONPATH": str(SERVERS),
            "BENCH_COUNTER_DIR": str(Path(tmp) / "counters"),
            HAPROXY_FLAG: os.environ.get(HAPROXY_FLAG, "0"),
        }
        ray.init(
            num_cpus=args.num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": env},
        )
        try:
            serve.start(
                http_options={"host": "127.0.0.1", "port": port},
                logging_config={"log_level": "WARNING", "enable_access_log": False},
            )
            for contender in contenders(args.replicas, args.max_ongoing):
                if args.only and contender.name not in args.only:
                    continue
                print(f"--- proxy: {args.proxy}", flush=True)
                runs.append(bench(contender, url, Path(tmp), args))
        finally:
            serve.shutdown()
            ray.shutdown()
    return {
        "proxy": PROXIES[args.proxy],
        "runs": runs,
        "ratios": ratios(runs, args.levels, args.replicas),
    }


def write_report(args: argparse.Namespace, parts: dict[str, Any]) -> None:
    report = {
        "machine": machine(),
        "ray": ray.__version__,
        "microbatch": microbatch.__version__,
        "num_cpus": args.num_cpus,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "max_ongoing_requests": args.max_ongoing,
        "proxies": parts,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "ray.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out_dir / "ray.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
