"""The front's CPU time per request, in one process, without the kernel: closed-loop
clients on fake transports drive ``microbatch serve``'s connection layer over a real
:class:`~microbatch.Service` (a thread stage whose model answers at once), so a
request goes through everything a served one does (parse, checks, the batcher and
its policy, the answer, metrics, ``Server-Timing``) but no socket.

On this shared machine the CPU time per request of a served process moved by up to
2x between runs (``benchmarks/http_serving.py``), so a change of a few percent in
the front cannot be seen there. Here there is no other process and no system call
per request: ``time.process_time()`` over ``--requests`` requests, each source
tree in a process of its own, the trees alternated ``--rounds`` times; the report
gives each round's figure and the median.

Run: ``python benchmarks/front_cpu.py [--before-src /tmp/before/src]``. The trees
are imported as they are: this checkout's ``src/`` is pure Python; for the hot path
compiled as the wheel compiles it, make a tree with ``benchmarks/compiled_tree.py``
(``python benchmarks/compiled_tree.py src /tmp/compiled``, then ``--before-src
/tmp/compiled/src``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REQUEST = (
    b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Type: application/json\r\nContent-Length: 10\r\n\r\n"
    b'{"x": 1.5}'
)


class _Transport:
    """A connection's far end: each response ends the request, and its client
    sends the next one on the loop's next turn (until the run's requests are sent)."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.run.answered(self, data)

    def close(self) -> None:
        raise AssertionError("a connection closed")

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )


class _Run:
    """Closed-loop clients: ``requests`` in all, over ``connections`` connections."""

    def __init__(self, requests: int) -> None:
        self.left = requests
        self.done = asyncio.get_running_loop().create_future()
        self.outstanding = 0

    def send(self, transport: _Transport) -> None:
        if self.left:
            self.left -= 1
            self.outstanding += 1
            transport.protocol.data_received(REQUEST)

    def answered(self, transport: _Transport, data: bytes) -> None:
        if not data.startswith(b"HTTP/1.1 200"):
            raise AssertionError(data[:200])
        self.outstanding -= 1
        if self.left:
            asyncio.get_running_loop().call_soon(self.send, transport)
        elif not self.outstanding and not self.done.done():
            self.done.set_result(None)


async def _measure(connections: int, requests: int) -> float:
    """CPU µs per request of this interpreter's microbatch (one measured run after
    a warm-up run)."""
    import microbatch
    from microbatch.http.app import HttpApp
    from microbatch.serve.http_front import ConnectionLimits, Front
    from microbatch.serve.server import quiet_garbage_collector

    class Echo(microbatch.Model):
        def predict(self, batch: list[dict[str, float]]) -> list[dict[str, float]]:
            return [{"y": 2 * item["x"]} for item in batch]

    config = microbatch.BatchConfig(max_batch_size=64, max_latency_ms=5)
    service = microbatch.Service(microbatch.Stage(Echo, mode="thread", batching=config))
    app = HttpApp(service)
    async with service:
        quiet_garbage_collector()  # as `microbatch serve` does once its service started
        front = Front(app, ConnectionLimits(), app.native_predictors(), app.record)
        seconds = 0.0
        for measured in (False, True):
            run = _Run(requests)
            transports = [_Transport(run) for _ in range(connections)]
            for transport in transports:
                transport.protocol = front()
                transport.protocol.connection_made(transport)
            started = time.process_time()
            for transport in transports:
                run.send(transport)
            await run.done
            if measured:
                seconds = time.process_time() - started
            for transport in transports:  # gone: no idle timer of theirs fires later
                transport.protocol.connection_lost(None)
    return 1e6 * seconds / requests


def _child(connections: int, requests: int) -> None:
    import uvloop

    print(json.dumps(uvloop.run(_measure(connections, requests))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the trees")
    parser.add_argument("--before-src", type=Path, help="also measure this source tree")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.connections, args.requests)
        return
    trees = {"this checkout": ROOT / "src"}
    if args.before_src is not None:
        trees = {"before": args.before_src.resolve(), **trees}
    figures: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            env = {**os.environ, "PYTHONPATH": str(src)}
            command = [sys.executable, __file__, "--child"]
            command += ["--connections", str(args.connections), "--requests", str(args.requests)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
            figures[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{name}: {figures[name][-1]:.2f} µs per request", flush=True)
    print()
    print(f"| tree | CPU µs per request, {args.connections} connections (each round) | median |")
    print("|---|---|---:|")
    for name, values in figures.items():
        rounds = ", ".join(f"{value:.2f}" for value in values)
        print(f"| {name} | {rounds} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
