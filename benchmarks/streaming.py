"""Streams: step-wise batching against lockstep, side by side in one run.

A simulated step model: each step takes ``1 ms + 10 µs x items in the step`` (a
sleep in the worker thread, as an accelerator would); output lengths are
long-tailed between 8 and 256 steps (log-uniform: many short, a few long). At 16
and 64 concurrent streams (closed loop: each client opens its next stream when its
last one ended), the same list of lengths goes to

* **microbatch step-wise**: a ``StepModel``; items join and leave between steps;
* **microbatch lockstep**: a generator ``predict``; a batch runs until its longest
  item ends (padded: every step costs the whole batch), new items wait for it —
  how peers batch streams (LitServe ``stream=True`` with batching, Ray Serve
  ``@serve.batch`` over generators, MOSEC SSE).

Over HTTP (each server started and stopped by this harness on 127.0.0.1): both of
ours (``microbatch serve``), LitServe's continuous-batching loop and its
``stream=True`` with batching, MOSEC with SSE, and Ray Serve's ``@serve.batch`` over
an async generator (a local Ray instance of 2 CPUs, from this interpreter's
environment, where the ``test`` extra installs Ray).

Reported per contender: chunks/s, time to first chunk p50/p99 (also in step times
of the step-wise run), total time p50/p99 for short (≤ 16 chunks) and long (≥ 128)
streams. Targets (issue 17, at 64 streams): step-wise ≥ 2x the chunks/s of every
lockstep contender; TTFC p99 ≤ 5 step times; short streams' total p99 ≤ a third of
lockstep's.

Run: ``python benchmarks/streaming.py`` (about 20 s); writes
``benchmarks/results/streaming.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import uvloop

import microbatch
from microbatch import END, Service, Stage, StepModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "servers"))
from stream_models import MAX_ACTIVE, step_time_s

from harness import ROOT, Contender, ensure_venv, serving, versions

sys.path.insert(0, str(ROOT))
from examples.generate import CharModel, Prompt

RESULTS = Path(__file__).resolve().parent / "results"


class SimulatedSteps(StepModel):
    """Item ``n``: ``n`` chunks; each step sleeps like an accelerator would."""

    def start(self, items: list[int]) -> list[list[int]]:
        return [[n, 0] for n in items]

    def step(self, states: list[list[int]]) -> tuple[list[int], list[bool]]:
        time.sleep(step_time_s(len(states)))
        for state in states:
            state[1] += 1
        return [state[1] for state in states], [position >= n for n, position in states]


class SimulatedLockstep(microbatch.Model):
    """The same model as a generator ``predict``: the whole batch steps until its
    longest item ends (finished items are padding: they still cost)."""

    def predict(self, batch: list[int]) -> Iterator[list[Any]]:
        for position in range(1, max(batch) + 1):
            time.sleep(step_time_s(len(batch)))
            yield [position if position <= n else END for n in batch]


def lengths(count: int, seed: int) -> list[int]:
    """Long-tailed output lengths in [8, 256] (log-uniform)."""
    rng = random.Random(seed)
    return [min(256, int(8 * 32 ** rng.random())) for _ in range(count)]


async def run_one(
    model: type[microbatch.Model],
    concurrency: int,
    work: list[int],
    item: Callable[[int], Any] = int,
    kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Stream every length in ``work`` (``item(length)`` is what is sent) with
    ``concurrency`` clients; the figures."""
    stage = Stage(
        model, mode="thread", max_batch_size=MAX_ACTIVE, max_queue=10_000, kwargs=kwargs or {}
    )
    service = Service(stage)
    records: list[tuple[int, float, float]] = []  # length, first chunk s, total s
    queue = list(reversed(work))

    async def client() -> None:
        while queue:
            length = queue.pop()
            opened = time.perf_counter()
            first = None
            count = 0
            async for _ in service.stream(item(length)):
                if first is None:
                    first = time.perf_counter() - opened
                count += 1
            assert count == length and first is not None
            records.append((length, first, time.perf_counter() - opened))

    async with service:
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        streams = service.stats().stages[0].streams
    assert streams is not None
    figures = summarise(records, wall)
    figures["mean_step_ms"] = 1000 * streams.step_seconds / max(1, streams.steps)
    return figures


def summarise(records: list[tuple[int, float, float]], wall: float) -> dict[str, Any]:
    """Chunks/s and the latency percentiles of (length, first chunk s, total s) records."""
    firsts = sorted(r[1] for r in records)
    short = sorted(r[2] for r in records if r[0] <= 16)
    long = sorted(r[2] for r in records if r[0] >= 128)
    return {
        "streams": len(records),
        "chunks": sum(r[0] for r in records),
        "seconds": wall,
        "chunks_per_s": sum(r[0] for r in records) / wall,
        "ttfc_p50_ms": 1000 * percentile(firsts, 0.50),
        "ttfc_p99_ms": 1000 * percentile(firsts, 0.99),
        "short_total_p50_ms": 1000 * percentile(short, 0.50),
        "short_total_p99_ms": 1000 * percentile(short, 0.99),
        "long_total_p50_ms": 1000 * percentile(long, 0.50),
        "long_total_p99_ms": 1000 * percentile(long, 0.99),
    }


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nan when there are none)."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


IN_PROCESS = {"microbatch step-wise": SimulatedSteps, "microbatch lockstep": SimulatedLockstep}
"""In-process contenders: ``service.stream`` (no HTTP)."""


class CharLockstep(microbatch.Model):
    """The generative example's model as a generator ``predict``: every step runs
    the whole batch (finished items as padding) until its longest item ends."""

    def __init__(self, train_s: float) -> None:
        self.model = CharModel(train_s=train_s)

    def setup(self, worker: microbatch.WorkerContext) -> None:
        self.model.setup(worker)

    def predict(self, batch: list[Prompt]) -> Iterator[list[Any]]:
        states = self.model.start(batch)
        left = [prompt.max_tokens for prompt in batch]
        for _ in range(max(left)):
            chunks, _ = self.model.step(states)  # type: ignore[arg-type]
            yield [chunk if n > 0 else END for chunk, n in zip(chunks, left, strict=True)]
            left = [n - 1 for n in left]


GENERATIVE = {"generate.py step-wise": CharModel, "generate.py lockstep": CharLockstep}
"""The generative example (a character GRU, torch, trained 2 s at start-up)."""


# -- over HTTP -------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpContender:
    """A streaming server: how it is started, where a stream is asked for, and
    whether it batches step-wise."""

    label: str
    server: Contender
    path: str
    env: dict[str, str]
    stepwise: bool

    def body(self, length: int) -> bytes:
        """The request for a stream of ``length`` chunks (microbatch takes the bare
        number: its item type is ``int``)."""
        item: object = length if self.server.framework == "microbatch" else {"n": length}
        return json.dumps(item).encode()


@dataclass(frozen=True)
class InThisEnvironment(Contender):
    """A server run by this interpreter, from the environment it runs in (Ray is
    installed there by the ``test`` extra: too heavy for a virtualenv of its own)."""

    @property
    def venv(self) -> Path:
        return Path(sys.prefix)

    @property
    def python(self) -> Path:
        return Path(sys.executable)


_MICROBATCH = ("-e", f"{ROOT}[http]")
HTTP_CONTENDERS = [
    HttpContender(
        "microbatch step-wise (HTTP, NDJSON)",
        Contender(
            "microbatch-stream",
            "microbatch",
            "stream_microbatch:stepwise",
            _MICROBATCH,
            "/stream",
            "/health/ready",
            "StepModel, thread stage, max_batch_size 64",
        ),
        "/stream",
        {},
        True,
    ),
    HttpContender(
        "microbatch lockstep (HTTP, NDJSON)",
        Contender(
            "microbatch-stream-lockstep",
            "microbatch",
            "stream_microbatch:lockstep",
            _MICROBATCH,
            "/stream",
            "/health/ready",
            "generator predict, max_batch_size 64",
            venv_name="microbatch-stream",
        ),
        "/stream",
        {},
        False,
    ),
    HttpContender(
        "LitServe continuous-batching loop",
        Contender(
            "litserve-stream",
            "litserve",
            "stream_litserve.py",
            ("litserve==0.2.19",),
            "/predict",
            "/health",
            "ContinuousBatchingLoop, max_batch_size 64",
        ),
        "/predict",
        {"STREAM_LOOP": "continuous"},
        True,
    ),
    HttpContender(
        "LitServe stream=True + batching",
        Contender(
            "litserve-stream-batched",
            "litserve",
            "stream_litserve.py",
            ("litserve==0.2.19",),
            "/predict",
            "/health",
            "stream=True, max_batch_size 64, batch_timeout 10 ms",
            venv_name="litserve-stream",
        ),
        "/predict",
        {"STREAM_LOOP": "batched"},
        False,
    ),
    HttpContender(
        "MOSEC SSE",
        Contender(
            "mosec-stream",
            "mosec",
            "stream_mosec.py",
            ("mosec==0.9.8",),
            "/inference",
            "/",
            "1 worker, max_batch_size 64, max_wait_time 10 ms",
        ),
        "/inference",
        {},
        False,
    ),
    HttpContender(
        "Ray Serve @serve.batch generator",
        InThisEnvironment(
            "ray-stream",
            "ray",
            "stream_ray.py",
            (),
            "/predict",
            "/health",
            "@serve.batch over an async generator, max_batch_size 64, batch_wait_timeout"
            " 10 ms, one batch at a time; local Ray, 2 CPUs",
        ),
        "/predict",
        {},
        False,
    ),
]


async def http_stream(
    address: tuple[str, int], contender: HttpContender, length: int, client: _Client
) -> tuple[float, float, int]:
    """POST one stream of ``length`` chunks on ``client``'s connection; (first chunk
    s, total s, chunks). Each chunk carries one ``@`` whatever the framing (SSE,
    NDJSON, plain lines), counted as the bytes arrive by a bare protocol (no reader,
    no future per read: the client's own CPU time weighs on what it measures, on a
    shared machine)."""
    path, body = contender.path, contender.body(length)
    opened = time.perf_counter()
    counter = await client.connection(address)
    response = counter.expect()
    counter.transport.write(
        f"POST {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n"
        f"Content-Type: application/json\r\nAccept: application/x-ndjson\r\n"
        f"Content-Length: {len(body)}\r\n{client.connection_header}\r\n".encode()
        + body
    )
    try:
        await response
    finally:
        client.done(counter)
    if not counter.head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{path}: {counter.head.splitlines()[:1]!r}")
    if counter.chunks != length or counter.first is None:
        raise RuntimeError(f"{path}: {counter.chunks} chunks for a stream of {length}")
    return counter.first - opened, time.perf_counter() - opened, counter.chunks


class _Client:
    """One client's connection: a new one per stream (``Connection: close``, the
    default), or, with ``keep_alive``, one kept open and reused for the client's
    next stream (as a pooled client like httpx or openai's does)."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.connection_header = "" if keep_alive else "Connection: close\r\n"
        self._kept: _ChunkCounter | None = None

    async def connection(self, address: tuple[str, int]) -> _ChunkCounter:
        """The kept connection if it is still open, else a new one."""
        kept, self._kept = self._kept, None
        if kept is not None and not kept.lost:
            return kept
        loop = asyncio.get_running_loop()
        _, counter = await loop.create_connection(lambda: _ChunkCounter(self.keep_alive), *address)
        return counter

    def done(self, counter: _ChunkCounter) -> None:
        """The response is over: keep its connection for the next one, or close it."""
        if self.keep_alive and not counter.lost:
            self._kept = counter
        else:
            counter.transport.close()

    def close(self) -> None:
        """Close the kept connection."""
        if self._kept is not None:
            self._kept.transport.close()
            self._kept = None


_LAST_CHUNK = b"\r\n0\r\n\r\n"
"""How a chunked body ends (the CRLF before it ends the last data chunk, or the head)."""


class _ChunkCounter(asyncio.Protocol):
    """Responses read to their end (the server closes, or with ``keep_alive`` the
    chunked body's last chunk): each one's head, then ``@``s counted, and when the
    first came."""

    def __init__(self, keep_alive: bool = False) -> None:
        self.keep_alive = keep_alive
        self.transport: asyncio.Transport
        self.lost = False
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def expect(self) -> asyncio.Future[None]:
        """Start counting the next response; done when it ended."""
        self.head = b""
        self._in_head = True
        self._tail = b""
        self.chunks = 0
        self.first: float | None = None
        self.ended = asyncio.get_running_loop().create_future()
        return self.ended

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self._in_head = False
            data, self.head = self.head[end + 4 :], self.head[: end + 4]
            if self.keep_alive and b"transfer-encoding: chunked" not in self.head.lower():
                self.ended.set_exception(RuntimeError("keep-alive needs a chunked response"))
                self.transport.close()
                return
            self._tail = b"\r\n"
        found = data.count(b"@")
        if found and self.first is None:
            self.first = time.perf_counter()
        self.chunks += found
        if self.keep_alive:
            self._tail = (self._tail + data)[-len(_LAST_CHUNK) :]
            if self._tail == _LAST_CHUNK and not self.ended.done():
                self.ended.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.ended.done():
            self.ended.set_result(None)


async def http_run(
    address: tuple[str, int],
    contender: HttpContender,
    concurrency: int,
    work: list[int],
    keep_alive: bool = False,
) -> dict[str, Any]:
    """Stream every length in ``work`` with ``concurrency`` clients, each on a new
    connection per stream or (``keep_alive``) on one connection it reuses."""
    records: list[tuple[int, float, float]] = []
    queue = list(reversed(work))

    async def client() -> None:
        own = _Client(keep_alive)
        try:
            while queue:
                length = queue.pop()
                first, total, _ = await http_stream(address, contender, length, own)
                records.append((length, first, total))
        finally:
            own.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return summarise(records, time.perf_counter() - started)


CLIENT_LOOPS: dict[str, Callable[[Any], Any]] = {"uvloop": uvloop.run, "asyncio": asyncio.run}
"""The event loops the HTTP client can run on: uvloop by default (the same for every
contender), so that the client's own CPU time weighs less on what it measures."""


def run_http(
    rounds: int,
    levels: list[int],
    logs: Path,
    only: list[str] | None = None,
    client_loop: str = "uvloop",
    keep_alive: bool = False,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every HTTP contender (or those whose label starts with one of ``only``) at
    every level, the client on ``client_loop``, each client on a new connection per
    stream or (``keep_alive``) on one it reuses; (figures, versions)."""
    run_client = CLIENT_LOOPS[client_loop]
    results: dict[str, Any] = {}
    seen: dict[str, str] = {}
    logs.mkdir(parents=True, exist_ok=True)
    for contender in HTTP_CONTENDERS:
        if only and not contender.label.startswith(tuple(only)):
            continue
        if isinstance(contender.server, InThisEnvironment):
            seen[contender.label] = versions(contender.server, ("ray", "starlette", "uvicorn"))
        else:
            ensure_venv(contender.server)
            seen[contender.label] = versions(contender.server)
        log = logs / f"{contender.server.name}.log"
        with serving(contender.server, contender.env, log) as running:
            host, port = running.base.removeprefix("http://").rsplit(":", 1)
            address = (host, int(port))
            run_client(http_run(address, contender, 4, [3] * 8))  # warm-up
            for concurrency in levels:
                work = lengths(rounds * concurrency, seed=concurrency)
                figures = run_client(http_run(address, contender, concurrency, work, keep_alive))
                figures["stepwise"] = contender.stepwise
                results[f"{contender.label} @ {concurrency}"] = figures
                print(f"{contender.label:40} @ {concurrency:3}: {_rounded(figures)}", flush=True)
    return results, seen


def _rounded(figures: dict[str, Any]) -> str:
    return json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()})


async def run_in_process(rounds: int, levels: list[int]) -> dict[str, Any]:
    """Both in-process contenders at every level."""
    results: dict[str, Any] = {}
    for concurrency in levels:
        work = lengths(rounds * concurrency, seed=concurrency)
        for name, model in IN_PROCESS.items():
            figures = await run_one(model, concurrency, work)
            figures["stepwise"] = model is SimulatedSteps
            results[f"{name} @ {concurrency}"] = figures
            print(f"{name:40} @ {concurrency:3}: {_rounded(figures)}", flush=True)
    return results


async def run_generative(rounds: int, levels: list[int]) -> dict[str, Any]:
    """The generative example, step-wise and lockstep, at every level."""
    results: dict[str, Any] = {}
    for concurrency in levels:
        work = lengths(rounds * concurrency, seed=concurrency)
        for name, model in GENERATIVE.items():
            figures = await run_one(
                model,
                concurrency,
                work,
                item=lambda n: Prompt("Beautiful is ", max_tokens=n),
                kwargs={"train_s": 2.0},
            )
            figures["stepwise"] = model is CharModel
            results[f"{name} @ {concurrency}"] = figures
            print(f"{name:40} @ {concurrency:3}: {_rounded(figures)}", flush=True)
    return results


# -- the report ------------------------------------------------------------------------


def table(results: dict[str, Any]) -> list[str]:
    """One markdown row per contender and level."""
    lines = [
        "| contender | streams | chunks/s | TTFC p50 ms | TTFC p99 ms"
        " | short (≤16) total p50/p99 ms | long (≥128) total p50/p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, f in results.items():
        lines.append(
            f"| {key} | {f['streams']} | {f['chunks_per_s']:.0f} | {f['ttfc_p50_ms']:.1f}"
            f" | {f['ttfc_p99_ms']:.1f}"
            f" | {f['short_total_p50_ms']:.0f} / {f['short_total_p99_ms']:.0f}"
            f" | {f['long_total_p50_ms']:.0f} / {f['long_total_p99_ms']:.0f} |"
        )
    return lines


def targets(results: dict[str, Any], ours: str, level: int, step_ms: float) -> list[str]:
    """The issue's targets for ``ours`` against every other contender at ``level``."""
    mine = results.get(f"{ours} @ {level}")
    if mine is None:
        return []
    lines = [f"{ours} at {level} streams (one step: {step_ms:.2f} ms):", ""]
    for key, other in results.items():
        if not key.endswith(f" @ {level}") or key.startswith(ours):
            continue
        name = key.rsplit(" @ ", 1)[0]
        ratio = mine["chunks_per_s"] / other["chunks_per_s"]
        goal = 1.0 if other["stepwise"] else 2.0
        verdict = "met" if ratio >= goal else "missed"
        line = f"- chunks/s ÷ {name}: **{ratio:.2f}x** (target ≥ {goal:.0f}x: {verdict})"
        if not other["stepwise"]:
            short = mine["short_total_p99_ms"] / other["short_total_p99_ms"]
            verdict = "met" if short <= 1 / 3 else "missed"
            line += f"; short streams' total p99 ratio **{short:.2f}** (target ≤ 0.33: {verdict})"
        lines.append(line)
    ttfc = mine["ttfc_p99_ms"] / step_ms
    verdict = "met" if ttfc <= 5 else "missed"
    lines += [f"- TTFC p99 = **{ttfc:.1f} step times** (target ≤ 5: {verdict})", ""]
    return lines


def report(
    inproc: dict[str, Any],
    generative: dict[str, Any],
    http: dict[str, Any],
    seen: dict[str, str],
    levels: list[int],
    kept_alive: dict[str, Any] | None = None,
) -> str:
    step_ms = 1000 * step_time_s(MAX_ACTIVE)
    lines = [
        "# Streams: step-wise against lockstep (`benchmarks/streaming.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python"
        f" {platform.python_version()}; shared with other jobs (other engineers' test"
        " runs) while it ran, so absolute numbers are noisy: read the ratios, all from"
        " one run.",
        "",
        "Simulated step model: each step sleeps 1 ms + 10 us x items in the step; output"
        " lengths log-uniform in [8, 256] (the same list for every contender); closed"
        " loop (a client opens its next stream when its last one ended); at most 64"
        " items per step everywhere. Step-wise: items join and leave between steps."
        " Lockstep: a batch runs until its longest item ends, every step costing the"
        " whole batch.",
        "",
        "## In-process (`service.stream`: the batching strategy alone)",
        "",
        *table(inproc),
        "",
        *targets(inproc, "microbatch step-wise", 64, step_ms),
    ]
    if generative:
        mean_step = generative.get("generate.py step-wise @ 64", {}).get("mean_step_ms", 0.0)
        lines += [
            "## The generative example (`examples/generate.py`, in-process)",
            "",
            "A character GRU (torch, hidden 128, one thread) trained 2 s at start-up; the"
            " same lengths as above as `max_tokens`. Lockstep: the same model as a"
            " generator `predict`, every step over the whole batch.",
            "",
            *table(generative),
            "",
            *targets(generative, "generate.py step-wise", 64, mean_step),
        ]
    if http:
        lines += [
            "## Over HTTP (one stream per connection, the client counts chunks as they arrive)",
            "",
            *table(http),
            "",
            *targets(http, "microbatch step-wise (HTTP, NDJSON)", 64, step_ms),
        ]
    if kept_alive:
        lines += [
            "## Over HTTP, connections kept alive (`--connections both`)",
            "",
            "The same client for every contender, each of its clients reusing one"
            " connection for its next stream (as pooled clients like httpx do) instead"
            " of a new connection per stream.",
            "",
            *table(kept_alive),
            "",
            *targets(kept_alive, "microbatch step-wise (HTTP, NDJSON)", 64, step_ms),
        ]
    if http or kept_alive:
        lines += [
            "Versions:",
            "",
            *(f"- {label}: {text}" for label, text in seen.items()),
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="streams per client")
    parser.add_argument("--levels", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--no-http", action="store_true", help="in-process contenders only")
    parser.add_argument("--no-generative", action="store_true", help="skip examples/generate.py")
    parser.add_argument("--http-only", nargs="*", help="only the HTTP contenders named so")
    parser.add_argument(
        "--client-loop", choices=sorted(CLIENT_LOOPS), default="uvloop", help="the client's loop"
    )
    parser.add_argument(
        "--connections",
        choices=["new", "kept", "both"],
        default="new",
        help="a new connection per stream (the default), kept alive and reused, or both",
    )
    args = parser.parse_args()
    inproc = asyncio.run(run_in_process(args.rounds, args.levels))
    generative = {} if args.no_generative else asyncio.run(run_generative(2, args.levels))
    http: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for keep_alive, into in ((False, http), (True, kept)):
        if args.no_http or args.connections == ("new", "kept")[not keep_alive]:
            continue
        figures, seen = run_http(
            args.rounds,
            args.levels,
            RESULTS / "logs",
            args.http_only,
            args.client_loop,
            keep_alive,
        )
        into.update(figures)
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "in_process": inproc,
        "generative": generative,
        "http": http,
        "http_keep_alive": kept,
        "versions": seen,
    }
    (RESULTS / "streaming.json").write_text(json.dumps(payload, indent=2))
    text = report(inproc, generative, http, seen, args.levels, kept)
    (RESULTS / "streaming.md").write_text(text + "\n")
    print(text)
