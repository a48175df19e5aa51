"""Gathering joiners against continuous admission, on the generative example.

Starting items costs about a step, which every active stream waits for; the step
loop can let joiners gather (``Stage(min_joiners=..., max_join_wait_ms=...)``) so
that one start serves several. This runs ``examples/generate.py`` in-process at
64 closed-loop streams (the lengths of ``benchmarks/streaming.py``), alternating
the settings so that the machine's noise hits each alike.

Run: ``python benchmarks/stream_admission.py`` (about 2 minutes); prints one line
per run, then a summary per setting (ratios to lockstep, TTFC in step times).
``--mode thread`` runs the model in a thread instead of a worker process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

# first: it puts the repository root on sys.path
from streaming import WARM_UP, CharLockstep, lengths, run_one

# isort: split
from examples.generate import CharModel, Prompt

SETTINGS = {"continuous": (1, 0.0), "gather 8 / 2 ms": (8, 2.0), "gather 16 / 4 ms": (16, 4.0)}


async def main(streams: int, rounds: int, repeats: int, mode: str) -> None:
    """Each setting, and lockstep, ``repeats`` times, alternating; one line of figures
    per run, then per setting its median chunks/s, its median ratio to lockstep in
    the same repeat, and its median TTFC p99 in its own step times."""
    work = lengths(rounds * streams, seed=streams)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in [*SETTINGS, "lockstep"]}
    for _ in range(repeats):
        for label in runs:
            options: dict[str, Any] = {"mode": mode}
            if label in SETTINGS:
                min_joiners, wait_ms = SETTINGS[label]
                options |= {"min_joiners": min_joiners, "max_join_wait_ms": wait_ms}
            figures: dict[str, Any] = await run_one(
                CharLockstep if label == "lockstep" else CharModel,
                streams,
                work,
                item=lambda n: Prompt("Beautiful is ", max_tokens=n),
                kwargs={"train_s": 2.0},
                stage_options=options,
                examples=WARM_UP,
            )
            runs[label].append(figures)
            shown = {k: round(v, 2) for k, v in figures.items() if isinstance(v, float)}
            print(f"{label:18} {shown}", flush=True)
    lockstep = runs.pop("lockstep")
    for label, done in runs.items():
        pairs = zip(done, lockstep, strict=True)
        ratios = [mine["chunks_per_s"] / theirs["chunks_per_s"] for mine, theirs in pairs]
        steps = [run["ttfc_p99_ms"] / run["mean_step_ms"] for run in done]
        each = ", ".join(f"{ratio:.2f}" for ratio in ratios)
        print(
            f"{label:18} chunks/s {statistics.median(r['chunks_per_s'] for r in done):,.0f}"
            f"  ÷ lockstep {statistics.median(ratios):.2f}x ({each})"
            f"  TTFC p99 {statistics.median(steps):.1f} step times"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8, help="streams per client")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--mode", choices=["process", "thread"], default="process", help="where the model runs"
    )
    arguments = parser.parse_args()
    asyncio.run(main(arguments.streams, arguments.rounds, arguments.repeats, arguments.mode))
