"""Streams over gRPC (``ModelStreamInfer``), over HTTP (NDJSON) and as OpenAI
completions (SSE), from one ``microbatch serve`` process: the simulated step model of
``benchmarks/streaming.py`` (each step sleeps 1 ms + 10 us x items; lengths
log-uniform in [8, 256]), 64 clients in a closed loop, alternated rounds.

* **gRPC**: each client holds one ``ModelStreamInfer`` call (as a ``tritonclient``
  stream does) on a shared channel and sends its next request on it when the last
  one's empty final response came; the client counts messages, it decodes none.
* **HTTP**: each client holds one kept-alive connection and POSTs ``/stream``
  (``benchmarks/stream_client.py``, NDJSON).
* **OpenAI SSE**: the same, POSTing ``/v1/completions`` with ``"stream": true`` and
  ``max_tokens`` the length (the server answers OpenAI's ``text_completion`` chunk
  objects as Server-Sent Events, then ``data: [DONE]``).

Reported per transport (the median round): chunks/s, time to first chunk p50/p99,
and the serving process's CPU per chunk (``/proc``, over the round).

Run: ``python benchmarks/grpc_streams.py [--rounds 3] [--streams 8]``; it writes
``benchmarks/results/grpc_streams.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "servers"))
from harness import ROOT, Contender, ensure_venv, free_port, machine, serving, versions
from stream_client import http_run
from stream_contenders import HttpContender
from stream_report import summarise
from streaming import lengths

RESULTS = Path(__file__).resolve().parent / "results"
CONCURRENCY = 64
MODEL = "Steps"  # the name of stream_microbatch's step-wise service
GIVE_UP_S = 300.0
GRPC_PORT = free_port()
SERVER = HttpContender(
    "microbatch step-wise (HTTP NDJSON and gRPC)",
    Contender(
        "microbatch-stream-grpc",
        "microbatch",
        "stream_microbatch:stepwise",
        (f"{ROOT}[http,grpc]",),
        "/stream",
        "/health/ready",
        "StepModel, thread stage, max_batch_size 64; --grpc-port",
        options=("--grpc-port", str(GRPC_PORT)),
    ),
    "/stream",
    {},
    True,
)


class _Completions(HttpContender):
    """The same server asked for OpenAI completion streams."""

    def body(self, length: int) -> bytes:
        asked = {"model": "steps", "prompt": "", "max_tokens": length, "stream": True}
        return json.dumps(asked).encode()


COMPLETIONS = _Completions(SERVER.label, SERVER.server, "/v1/completions", {}, True)


def _request(length: int) -> bytes:
    """A ModelStreamInfer request for a stream of ``length`` chunks, serialized."""
    from microbatch.grpc.messages import message

    request = message("ModelInferRequest")(model_name=MODEL, id=str(length))
    given = request.inputs.add(name="input", datatype="INT64", shape=[1, 1])
    given.contents.int64_contents.append(length)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return bytes(request.SerializeToString())


async def grpc_run(address: str, work: list[int]) -> dict[str, Any]:
    """Every length in ``work`` streamed by ``CONCURRENCY`` clients, each on one
    ModelStreamInfer call it keeps."""
    import grpc

    from microbatch.grpc.messages import SERVICE

    records: list[tuple[int, float, float, bool]] = []
    queue = list(reversed(work))
    bodies = {length: _request(length) for length in set(work)}
    async with grpc.aio.insecure_channel(address) as channel:
        method = channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer",
            request_serializer=lambda body: body,
            response_deserializer=lambda data: data,
        )

        async def client() -> None:
            call = method()
            at_start = True
            try:
                while queue:
                    length = queue.pop()
                    opened = time.perf_counter()
                    await call.write(bodies[length])
                    first = None
                    for _ in range(length + 1):  # its chunks, then its empty final response
                        response = await call.read()
                        if response[:1] != b"\x12":  # not infer_response alone: an error
                            raise RuntimeError(f"stream of {length}: {response!r}")
                        if first is None:
                            first = time.perf_counter() - opened
                    assert first is not None
                    records.append((length, first, time.perf_counter() - opened, at_start))
                    at_start = False
                await call.done_writing()
            finally:
                call.cancel()

        started = time.perf_counter()
        clients = asyncio.gather(*(client() for _ in range(CONCURRENCY)))
        await asyncio.wait_for(clients, GIVE_UP_S)
        return summarise(records, time.perf_counter() - started)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each transport")
    parser.add_argument("--streams", type=int, default=8, help="streams per client a round")
    args = parser.parse_args()
    ensure_venv(SERVER.server)
    runs: dict[str, list[dict[str, Any]]] = {
        "gRPC ModelStreamInfer": [],
        "HTTP NDJSON": [],
        "OpenAI completions SSE": [],
    }
    http_ways = {"HTTP NDJSON": SERVER, "OpenAI completions SSE": COMPLETIONS}
    log = RESULTS / "logs" / "grpc_streams.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with serving(SERVER.server, {}, log) as running:
        host, port = running.base.removeprefix("http://").rsplit(":", 1)
        asyncio.run(grpc_run(f"127.0.0.1:{GRPC_PORT}", [3] * 8))  # warm-up, both ways
        for way in http_ways.values():
            asyncio.run(http_run((host, int(port)), way, CONCURRENCY, [3] * 8, keep_alive=True))
        for round_ in range(args.rounds):
            work = lengths(args.streams * CONCURRENCY, seed=round_)
            for name in runs:
                before = _cpu_s(running.process.pid)
                if name.startswith("gRPC"):
                    figures = asyncio.run(grpc_run(f"127.0.0.1:{GRPC_PORT}", work))
                else:
                    way = http_ways[name]
                    http = http_run((host, int(port)), way, CONCURRENCY, work, keep_alive=True)
                    figures = asyncio.run(asyncio.wait_for(http, GIVE_UP_S))
                cpu = _cpu_s(running.process.pid) - before
                figures["server_cpu_us_per_chunk"] = 1e6 * cpu / figures["chunks"]
                runs[name].append(figures)
                shown = {k: round(v, 2) for k, v in figures.items() if isinstance(v, float)}
                print(f"{name:24} round {round_}: {shown}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    seen = versions(SERVER.server, ("microbatch", "grpcio", "protobuf", "uvloop"))
    payload = {"runs": runs, "versions": seen, "machine": machine()}
    (RESULTS / "grpc_streams.json").write_text(json.dumps(payload, indent=2))
    text = report(runs, payload["versions"])
    (RESULTS / "grpc_streams.md").write_text(text + "\n")
    print(text)


def report(runs: dict[str, list[dict[str, Any]]], seen: str) -> str:
    """The markdown table of the median round of each transport."""
    lines = [
        "# Streams over gRPC (`ModelStreamInfer`), HTTP (NDJSON) and OpenAI SSE, one server",
        "",
        f"Machine: {machine()}. Server: {seen}. {__doc__.split(chr(10) + chr(10))[0]}",
        "",
        "| transport | chunks/s (each round) | TTFC p50 ms | TTFC p99 ms | server CPU us/chunk |",
        "|---|---|---:|---:|---:|",
    ]
    for name, rounds in runs.items():
        median = statistics.median(r["chunks_per_s"] for r in rounds)
        middle = min(rounds, key=lambda r: abs(r["chunks_per_s"] - median))
        each = ", ".join(f"{r['chunks_per_s']:,.0f}" for r in rounds)
        lines.append(
            f"| {name} | {median:,.0f} ({each}) | {middle['ttfc_p50_ms']:.2f} |"
            f" {middle['ttfc_p99_ms']:.2f} | {middle['server_cpu_us_per_chunk']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
