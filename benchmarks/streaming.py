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

The generative example runs ``--generative-repeats`` times (3) per contender and
level, alternated, with ``--generative-rounds`` (16) streams per client: a run
lasts about two seconds (with 8, about one, its ratio moved from 1.3x to 2.8x
between runs on this shared machine); the report gives the median run and every
repeat's ratio. It runs its model in a worker process, as ``examples.generate``
serves it, then in a thread of the serving process (``--generative-modes``): there
the model's Python shares the GIL with the loop handing out its chunks.

Run: ``python benchmarks/streaming.py`` (a few minutes); writes
``benchmarks/results/streaming.json``, ``.md`` and ``.png`` (the plot, with matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import microbatch
from microbatch import END, Service, Stage, StepModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "servers"))
from stream_models import MAX_ACTIVE, step_time_s

from harness import ROOT, ensure_venv, serving, versions
from stream_client import CLIENT_LOOPS, http_run
from stream_contenders import HTTP_CONTENDERS, InThisEnvironment
from stream_report import median_run, microbatch_build, plot, report, summarise

sys.path.insert(0, str(ROOT))
from examples.generate import CharModel, Prompt
from examples.generate import service as shipped_service

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
    stage_options: dict[str, Any] | None = None,
    examples: Sequence[Any] = (),
) -> dict[str, Any]:
    """Stream every length in ``work`` (``item(length)`` is what is sent) with
    ``concurrency`` clients; the figures. ``stage_options``: more ``Stage`` settings;
    ``examples``: the service's warm-up items (run when it starts, before any client)."""
    settings: dict[str, Any] = {"mode": "thread", "max_batch_size": MAX_ACTIVE, "max_queue": 10_000}
    stage = Stage(model, kwargs=kwargs or {}, **{**settings, **(stage_options or {})})
    service = Service(stage, examples=examples)
    records: list[tuple[int, float, float, bool]] = []  # length, first s, total s, at start
    queue = list(reversed(work))

    async def client() -> None:
        at_start = True  # every client's first stream opens at once
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
            records.append((length, first, time.perf_counter() - opened, at_start))
            at_start = False

    async with service:
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        streams = service.stats().stages[0].streams
    assert streams is not None
    figures = summarise(records, wall)
    figures["mean_step_ms"] = 1000 * streams.step_seconds / max(1, streams.steps)
    return figures


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
        started = self.model.start(batch)  # each prompt read, its first character drawn
        states = [first.state for first in started]  # type: ignore[union-attr]
        yield [first.chunk for first in started]  # type: ignore[union-attr]
        left = [prompt.max_tokens - 1 for prompt in batch]
        for _ in range(max(left)):
            chunks, _ = self.model.step(states)  # type: ignore[arg-type]
            yield [chunk if n > 0 else END for chunk, n in zip(chunks, left, strict=True)]
            left = [n - 1 for n in left]


GENERATIVE = {"generate.py step-wise": CharModel, "generate.py lockstep": CharLockstep}
"""The generative example (a character GRU, torch, trained 2 s at start-up)."""

_SHIPPED = shipped_service.stages[0]
_JOINING = {"min_joiners": _SHIPPED.min_joiners, "max_join_wait_ms": _SHIPPED.max_join_wait_ms}
"""How the example gathers its joiners (its step-wise runs do as it does)."""

WARM_UP = list(shipped_service.examples)
"""The example's warm-up items: a served ``examples.generate`` streams them when it
starts, before it answers ready; both generative contenders do so too (the first
call of a torch model costs more than the next ones)."""


# -- over HTTP -------------------------------------------------------------------------


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
            widest = max(levels)  # warm-up: as many connections at once as measured
            run_client(http_run(address, contender, widest, [3] * widest))
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


async def run_generative(
    rounds: int, levels: list[int], repeats: int, mode: str = "process"
) -> dict[str, Any]:
    """The generative example, step-wise and lockstep, its model in a worker of
    ``mode`` (``"process"`` or ``"thread"``), at every level, ``repeats`` times in
    alternation; per contender the run of median chunks/s, the step-wise one with
    every repeat's ratio (``ratios``: its chunks/s over lockstep's in the same
    repeat)."""
    results: dict[str, Any] = {}
    for concurrency in levels:
        work = lengths(rounds * concurrency, seed=concurrency)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in GENERATIVE}
        for _ in range(repeats):
            for name, model in GENERATIVE.items():
                figures = await run_one(
                    model,
                    concurrency,
                    work,
                    item=lambda n: Prompt("Beautiful is ", max_tokens=n),
                    kwargs={"train_s": 2.0},
                    stage_options={"mode": mode, **(_JOINING if model is CharModel else {})},
                    examples=WARM_UP,
                )
                figures["stepwise"] = model is CharModel
                runs[name].append(figures)
                print(f"{name:40} @ {concurrency:3}: {_rounded(figures)}", flush=True)
        for name, done in runs.items():
            results[f"{name} @ {concurrency}"] = median_run(done)
        stepwise, lockstep = runs.values()
        results[f"{next(iter(runs))} @ {concurrency}"]["ratios"] = [
            mine["chunks_per_s"] / other["chunks_per_s"]
            for mine, other in zip(stepwise, lockstep, strict=True)
        ]
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="streams per client")
    parser.add_argument("--levels", type=int, nargs="+", default=[16, 64])
    parser.add_argument(
        "--generative-rounds", type=int, default=16, help="streams per client, generative example"
    )
    parser.add_argument(
        "--generative-repeats",
        type=int,
        default=3,
        help="runs of each generative contender, alternated (the median is reported)",
    )
    parser.add_argument("--no-http", action="store_true", help="in-process contenders only")
    parser.add_argument(
        "--generative-modes",
        nargs="+",
        choices=["process", "thread"],
        default=["process", "thread"],
        help="where the generative example's model runs (process: as it is served)",
    )
    parser.add_argument("--no-generative", action="store_true", help="skip examples/generate.py")
    parser.add_argument(
        "--no-simulated", action="store_true", help="skip the simulated model in-process"
    )
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
    parser.add_argument(
        "--name", default="streaming", help="results go to benchmarks/results/NAME.json and .md"
    )
    args = parser.parse_args()
    inproc = {} if args.no_simulated else asyncio.run(run_in_process(args.rounds, args.levels))
    generative = {
        mode: asyncio.run(
            run_generative(args.generative_rounds, args.levels, args.generative_repeats, mode)
        )
        for mode in ([] if args.no_generative else args.generative_modes)
    }
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
        "build": microbatch_build(),
    }
    (RESULTS / f"{args.name}.json").write_text(json.dumps(payload, indent=2))
    text = report(inproc, generative, http, seen, args.levels, kept)
    (RESULTS / f"{args.name}.md").write_text(text + "\n")
    plot(payload, RESULTS / f"{args.name}.png")
    print(text)
