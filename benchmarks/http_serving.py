"""HTTP serving side by side (issue 4): microbatch, MOSEC, LitServe, FastAPI without batching.

One command (creates the virtualenvs under ``benchmarks/.venvs/`` when missing)::

    python3 benchmarks/http_serving.py               # everything: ~25 min
    python3 benchmarks/http_serving.py --duration 3 --warmup 1 --contenders mosec fastapi
    # the cost of Server-Timing: compare server CPU/request of these two (or, less
    # noisy, benchmarks/server_timing.py)
    python3 benchmarks/http_serving.py --contenders microbatch microbatch-no-timing \
        --workloads scalar --levels 64 --name server_timing_http

Needs ``wrk`` (``apt-get install -y wrk``) and, for the plot, matplotlib in the
interpreter that runs this script (``.venv-bench/bin/pip install matplotlib``; the
plot is skipped without it). Load goes only to 127.0.0.1; every server is started
in its own process group and stopped by that group's id.

For each workload (``sim``: simulated accelerator; ``numpy``: one 256x256 float32
layer, BLAS pinned to 1 thread; ``scalar``: *scalar numpy*, ``{"x": float}`` expanded
to 256 floats, the same layer, ``{"y": float}`` back, 5 ms wait) and each contender,
one server is started, checked for correctness (concurrent distinct inputs, each
answer its own: ``y == 2x``; on ``scalar``, y as computed here), then driven by
``wrk`` in closed loop at each connection level: a warm-up, then the measured run.
The model counts its batches into a file, which gives the mean batch size; the CPU
time of the server's processes over the measured run (``/proc`` utime + stime)
divided by its requests gives the CPU per request: of the serving process (the one
started: for microbatch, the process that speaks HTTP and batches) and of every
process of the server (its process group: model workers, MOSEC's Rust front). Every
contender has one model worker, max batch 64 and a 10 ms wait (5 ms on ``scalar``;
see ``benchmarks/servers/`` for exactly what each one gets).

Writes ``benchmarks/results/http.json``, ``http.md`` and ``http.png`` (``--name``). Timings on a
shared machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import (
    LUA_DONE,
    RESULTS,
    ROOT,
    SERVERS,
    SINGLE_THREAD_BLAS,
    Contender,
    Running,
    ensure_venv,
    fmt,
    group_cpu_s,
    machine,
    microbatch_serve_available,
    process_cpu_s,
    run_wrk,
    serving,
    versions,
)

sys.path.insert(0, str(SERVERS))
from workloads import WIDTH, Workload, read_counter

from http_report import markdown, plot, ratios

LEVELS = [1, 16, 64, 256]

MICROBATCH = Contender(
    name="microbatch",
    framework="microbatch",
    server="microbatch_server:service",
    packages=(f"{ROOT}[http]", "numpy"),  # a regular install: the hot path compiled
    predict_path="/predict",
    health_path="/health/ready",
    settings="Service, 1 process Stage, BatchConfig(max_batch_size=64, "
    "max_latency_ms=10; 5 on scalar), adaptive policy",
)

CONTENDERS = {
    c.name: c
    for c in (
        MICROBATCH,
        replace(
            MICROBATCH,
            name="microbatch-2http",
            settings="as microbatch, with `serve --workers 2`: two HTTP processes in front "
            "of the one Service (still 1 model worker)",
            options=("--workers", "2"),
            venv_name="microbatch",
        ),
        replace(
            MICROBATCH,
            name="microbatch-4http",
            settings="as microbatch, with `serve --workers 4`: four HTTP processes in front "
            "of the one Service (still 1 model worker); for machines with many cores",
            options=("--workers", "4"),
            venv_name="microbatch",
        ),
        replace(
            MICROBATCH,
            name="microbatch-before",
            settings="as microbatch, with the code under --before-src (a checkout's src/ "
            "put first on PYTHONPATH): before and after in one run",
            venv_name="microbatch",
        ),
        replace(
            MICROBATCH,
            name="microbatch-pure",
            packages=("-e", f"{ROOT}[http]", "numpy"),
            settings="as microbatch, installed editable (`pip install -e`): pure Python, "
            "nothing compiled (hatch_build.py)",
        ),
        replace(
            MICROBATCH,
            name="microbatch-no-timing",
            settings="as microbatch, with `--no-server-timing`: the CPU per request of the "
            "Server-Timing header is the difference to microbatch (issue 19: within 5%)",
            options=("--no-server-timing",),
            venv_name="microbatch",
        ),
        Contender(
            name="mosec",
            framework="mosec",
            server="mosec_server.py",
            packages=("mosec", "numpy"),
            predict_path="/inference",
            health_path="/",
            settings="append_worker(num=1, max_batch_size=64, max_wait_time=10 ms; 5 on scalar)",
        ),
        Contender(
            name="litserve",
            framework="litserve",
            server="litserve_server.py",
            packages=("litserve", "numpy"),
            predict_path="/predict",
            health_path="/health",
            settings="LitAPI(max_batch_size=64, batch_timeout=0.01; 0.005 on scalar), "
            "workers_per_device=1, cpu",
        ),
        Contender(
            name="fastapi",
            framework="fastapi",
            server="fastapi_server.py",
            packages=("fastapi", "uvicorn[standard]", "numpy"),
            predict_path="/predict",
            health_path="/health",
            settings="no batching; sync endpoint, one model call at a time (a lock), "
            "1 uvicorn worker",
        ),
    )
}


BEFORE_SRC: Path | None = None  # --before-src: the code microbatch-before runs


def serving_workload(
    contender: Contender, workload: str, counter: Path, logs: Path
) -> AbstractContextManager[Running]:
    """Start the contender on a workload (BLAS on one thread, batches counted)."""
    env = {
        **SINGLE_THREAD_BLAS,
        "BENCH_WORKLOAD": workload,
        "BENCH_COUNTER_FILE": str(counter),
    }
    if contender.name == "microbatch-before":
        if BEFORE_SRC is None:
            raise SystemExit("microbatch-before needs --before-src PATH (a checkout's src/)")
        env["PYTHONPATH"] = str(BEFORE_SRC)
    return serving(contender, env, logs / f"{contender.name}-{workload}.log")


# -- load ----------------------------------------------------------------------------

LUA_SIM = """
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil, '{"x": ' .. (counter + 0.5) .. '}')
end
"""

LUA_STATIC = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '%s'
"""


def lua_script(workload: str, directory: Path) -> Path:
    """The wrk script for a workload: distinct ``x`` per request (sim) or a fixed vector."""
    if workload in ("sim", "scalar"):
        text = LUA_SIM
    else:
        vector = json.dumps({"x": [round((i % 17) / 17 - 0.5, 4) for i in range(WIDTH)]})
        text = LUA_STATIC % vector
    path = directory / f"{workload}.lua"
    path.write_text(text + LUA_DONE)
    return path


def measure(
    running: Running,
    contender: Contender,
    script: Path,
    counter: Path,
    connections: int,
    warmup_s: float,
    seconds: float,
) -> dict[str, Any]:
    """Warm up, then measure one connection level."""
    url = running.base + contender.predict_path
    if warmup_s > 0:
        run_wrk(url, script, connections, warmup_s)
    pid = running.process.pid
    before = read_counter(str(counter))
    cpu_before = process_cpu_s(pid), group_cpu_s(pid)
    summary = run_wrk(url, script, connections, seconds)
    cpu_after = process_cpu_s(pid), group_cpu_s(pid)
    after = read_counter(str(counter))
    batches, items = after[0] - before[0], after[1] - before[1]
    duration_s = summary["duration_us"] / 1e6
    errors = sum(summary[key] for key in ("connect", "read", "write", "timeout"))
    requests = max(1, summary["requests"])
    return {
        "server_cpu_us": 1e6 * (cpu_after[0] - cpu_before[0]) / requests,
        "all_cpu_us": 1e6 * (cpu_after[1] - cpu_before[1]) / requests,
        "connections": connections,
        "req_per_s": summary["requests"] / duration_s,
        "p50_ms": summary["p50_us"] / 1e3,
        "p99_ms": summary["p99_us"] / 1e3,
        "non2xx": summary["non2xx"],
        "socket_errors": errors,
        "mean_batch": items / batches if batches else None,
    }


# -- correctness ---------------------------------------------------------------------


def check_correct(running: Running, contender: Contender, workload: str) -> dict[str, Any]:
    """Concurrent distinct inputs; every reply must be its own (``y == 2x`` for sim)."""
    host, port = running.base.removeprefix("http://").split(":")

    def client(index: int) -> int:
        import http.client

        wrong = 0
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            for j in range(20):
                x = index * 1000 + j + 0.25
                body = {"x": [x / 1e4] * WIDTH} if workload == "numpy" else {"x": x}
                connection.request(
                    "POST",
                    contender.predict_path,
                    json.dumps(body),
                    {"Content-Type": "application/json"},
                )
                reply = connection.getresponse()
                data = json.loads(reply.read())
                if reply.status != 200 or not _is_right(workload, x, data):
                    wrong += 1
        finally:
            connection.close()
        return wrong

    with ThreadPoolExecutor(64) as pool:
        wrong = sum(pool.map(client, range(64)))
    return {"requests": 64 * 20, "wrong": wrong}


def _is_right(workload: str, x: float, data: Any) -> bool:
    if not isinstance(data, dict):
        return False
    if workload == "sim":
        return data.get("y") == 2 * x
    if workload == "scalar":
        expected = _scalar_model.predict([{"x": x}])[0]["y"]
        return isinstance(data.get("y"), float) and abs(data["y"] - expected) <= 1e-3 * max(
            1.0, abs(expected)
        )
    return len(data.get("y", ())) == WIDTH


_scalar_model = Workload("scalar", None)  # the expected answers, computed here


# -- one contender, all levels ---------------------------------------------------------


def bench_contender(
    contender: Contender, workload: str, levels: list[int], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """Start the contender once for a workload: correctness, then every level."""
    counter = work / f"{contender.name}-{workload}.count"
    counter.unlink(missing_ok=True)
    script = lua_script(workload, work)
    with serving_workload(contender, workload, counter, args.logs) as running:
        correctness = check_correct(running, contender, workload)
        print(f"[{contender.name}/{workload}] correctness: {correctness}", flush=True)
        rows = []
        for connections in levels:
            row = measure(
                running, contender, script, counter, connections, args.warmup, args.duration
            )
            rows.append(row)
            print(
                f"[{contender.name}/{workload}] c={connections:3d} {row['req_per_s']:8.0f} req/s "
                f"p50 {row['p50_ms']:7.2f} ms p99 {row['p99_ms']:7.2f} ms "
                f"non2xx {row['non2xx']} batch {fmt(row['mean_batch'])} "
                f"cpu/req {row['server_cpu_us']:.1f} us (all {row['all_cpu_us']:.1f} us)",
                flush=True,
            )
    return {"correctness": correctness, "levels": rows}


def bare_model_ms(workload: str, calls: int = 200) -> float:
    """Median milliseconds of one model call on one item, in this process: what a
    server adds at 1 connection is its p50 less this."""
    model = Workload(workload, None)
    body = {"x": [0.25] * WIDTH} if workload == "numpy" else {"x": 1.5}
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        model.predict([body])
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def added_latency(results: dict[str, Any], bare: dict[str, float]) -> dict[str, Any]:
    """Per workload and contender: p50 at 1 connection less the bare model call."""
    out: dict[str, Any] = {}
    for workload, by_contender in results.items():
        for name, data in by_contender.items():
            one = [row for row in data.get("levels", []) if row["connections"] == 1]
            if one and workload in bare:
                out.setdefault(workload, {})[name] = one[0]["p50_ms"] - bare[workload]
    return out


# -- main ----------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = [
        name
        for name in CONTENDERS
        if name not in ("microbatch-no-timing", "microbatch-before", "microbatch-4http")
    ]
    parser.add_argument("--contenders", nargs="+", default=default, choices=CONTENDERS)
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=["sim", "numpy", "scalar"],
        choices=["sim", "numpy", "scalar"],
    )
    parser.add_argument("--levels", nargs="+", type=int, default=LEVELS, help="connections")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per level")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per level")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--name", default="http", help="report file names: NAME.json, NAME.md, NAME.png"
    )
    parser.add_argument(
        "--before-src",
        type=Path,
        help="for microbatch-before: a src/ directory of the code to compare against "
        "(e.g. from `git archive BASE src | tar -x -C /tmp/before`)",
    )
    parser.add_argument("--logs", type=Path, default=RESULTS / "logs", help="server logs")
    return parser.parse_args()


def main() -> None:
    """Install what is missing, run every contender on every workload, write the report."""
    args = parse_args()
    global BEFORE_SRC
    BEFORE_SRC = args.before_src.resolve() if args.before_src else None
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    args.logs.mkdir(parents=True, exist_ok=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    contenders = [CONTENDERS[name] for name in args.contenders]
    info: dict[str, Any] = {}
    for contender in contenders:
        ensure_venv(contender)
        info[contender.name] = {"settings": contender.settings, "versions": versions(contender)}
    results: dict[str, dict[str, Any]] = {}
    bare = {workload: bare_model_ms(workload) for workload in args.workloads}
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        for workload in args.workloads:
            results[workload] = {}
            for contender in contenders:
                if contender.framework == "microbatch" and not microbatch_serve_available(
                    contender
                ):
                    print("[microbatch] `microbatch serve` is not in this checkout: skipped")
                    results[workload][contender.name] = {"skipped": "no `microbatch serve` yet"}
                    continue
                results[workload][contender.name] = bench_contender(
                    contender, workload, args.levels, args, Path(tmp)
                )
    report = {
        "machine": machine(),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "levels": args.levels,
        "contenders": info,
        "results": results,
    }
    report["ratios"] = ratios(results)
    report["bare_model_ms"] = bare
    report["added_ms"] = added_latency(results, bare)
    name = args.name
    (args.out_dir / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out_dir / f"{name}.md").write_text(markdown(report))
    plotted = plot(report, args.out_dir / f"{name}.png")
    print(markdown(report))
    print(f"wrote {args.out_dir}/{name}.json, {name}.md" + (f", {name}.png" if plotted else ""))


if __name__ == "__main__":
    main()
