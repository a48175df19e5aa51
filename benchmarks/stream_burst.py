"""Bursts of streams opened at once: what one new stream costs the server, and how
long the last of a burst waits for its first chunk (the first wave of
``benchmarks/streaming.py``, which sets its TTFC p99 at 64 streams).

The streaming benchmark's step-wise server (``microbatch serve
stream_microbatch:stepwise``: a step sleeps 1 ms + 10 µs x items) gets ``--bursts``
bursts of ``--streams`` streams of ``--length`` chunks, all opened in the same
moment (a new connection each, NDJSON, the benchmark's own client), with a pause
between bursts so that each one meets an idle server. Reported: the server
process's CPU time per stream (``/proc``, user + system), and per burst the wait of
its last stream for its first chunk (p50 and p90 over bursts, ms and step times).

With ``--before-src DIR`` (or ``--before-env NAME=VALUE``), a second server runs on
another source tree (say, a ``git archive`` of an earlier commit; or with other
settings) and the bursts alternate between the two, so both are measured in the
same minutes of a shared machine.

Run: ``python benchmarks/stream_burst.py [--before-src /tmp/before/src]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "servers"))
from stream_models import MAX_ACTIVE, step_time_s

from harness import ensure_venv, serving
from stream_client import StreamClient, http_stream
from stream_contenders import HTTP_CONTENDERS, HttpContender

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_PAUSE_S = 0.05  # between bursts: the server is idle again when the next one opens


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def contender_named(label: str) -> HttpContender:
    """The streaming benchmark's HTTP contender whose label starts with ``label``."""
    (found,) = [c for c in HTTP_CONTENDERS if c.label.startswith(label)]
    return found


async def one_burst(
    address: tuple[str, int], streams: int, length: int, contender: HttpContender
) -> float:
    """Open ``streams`` streams at once; the last first chunk's wait, in seconds."""
    clients = [StreamClient(keep_alive=False) for _ in range(streams)]
    waits = await asyncio.gather(
        *(http_stream(address, contender, length, client) for client in clients)
    )
    return max(first for first, _, _ in waits)


async def measure(
    servers: dict[str, tuple[tuple[str, int], int]],
    bursts: int,
    streams: int,
    length: int,
    contender: HttpContender,
) -> dict[str, tuple[float, list[float]]]:
    """Alternate bursts between ``servers`` (name: address, pid); per server its CPU
    seconds over its bursts and each burst's last wait."""
    for address, _ in servers.values():  # warm up: a few bursts each, not counted
        for _ in range(3):
            await one_burst(address, streams, length, contender)
    cpu = dict.fromkeys(servers, 0.0)
    waits: dict[str, list[float]] = {name: [] for name in servers}
    for _ in range(bursts):
        for name, (address, pid) in servers.items():
            await asyncio.sleep(_PAUSE_S)
            before = cpu_seconds(pid)
            waits[name].append(await one_burst(address, streams, length, contender))
            await asyncio.sleep(_PAUSE_S / 2)  # the streams' ends and closes
            cpu[name] += cpu_seconds(pid) - before
    return {name: (cpu[name], waits[name]) for name in servers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=60)
    parser.add_argument("--streams", type=int, default=MAX_ACTIVE)
    parser.add_argument("--length", type=int, default=4, help="chunks per stream")
    parser.add_argument("--before-src", type=Path, help="a second server on this source tree")
    parser.add_argument(
        "--before-env", action="append", default=[], help="NAME=VALUE for the second server"
    )
    parser.add_argument(
        "--contender",
        default=HTTP_CONTENDERS[0].label,
        help="the streaming benchmark's HTTP contender (a label's start), as served by"
        " microbatch: NDJSON /stream by default, or 'microbatch step-wise (OpenAI'",
    )
    args = parser.parse_args()
    contender = contender_named(args.contender)
    ensure_venv(contender.server)
    step_ms = step_time_s(args.streams) * 1e3
    logs = Path("/tmp")
    with ExitStack() as stack:
        running = {
            "this checkout": stack.enter_context(
                serving(contender.server, {}, logs / "burst_after.log")
            )
        }
        if args.before_src is not None or args.before_env:
            env = dict(pair.split("=", 1) for pair in args.before_env)
            if args.before_src is not None:
                env["PYTHONPATH"] = str(args.before_src.resolve())
            running["before"] = stack.enter_context(
                serving(contender.server, env, logs / "burst_before.log")
            )
        servers = {}
        for name, server in running.items():
            host, port = server.base.removeprefix("http://").split(":")
            servers[name] = ((host, int(port)), server.process.pid)
        results = uvloop.run(measure(servers, args.bursts, args.streams, args.length, contender))
    print(
        f"{args.bursts} bursts of {args.streams} streams of {args.length} chunks, "
        f"new connection each; one step at {args.streams} active: {step_ms:.2f} ms"
    )
    print("| server | CPU µs per stream | last first chunk p50 ms (steps) | p90 ms (steps) |")
    print("|---|---:|---:|---:|")
    for name, (cpu, waits) in results.items():
        per_stream_us = cpu / (args.bursts * args.streams) * 1e6
        deciles = statistics.quantiles(waits, n=10)
        p50, p90 = statistics.median(waits) * 1e3, deciles[8] * 1e3
        print(
            f"| {name} | {per_stream_us:.0f} | {p50:.2f} ({p50 / step_ms:.1f}) "
            f"| {p90:.2f} ({p90 / step_ms:.1f}) |"
        )


if __name__ == "__main__":
    main()
