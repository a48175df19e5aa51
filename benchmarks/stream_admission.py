"""Gathering joiners against continuous admission, on the generative example.

Starting items costs about a step, which every active stream waits for; the step
loop can let joiners gather (``StepLoop(min_joiners=..., max_join_wait_s=...)``)
so that one start serves several. This runs ``examples/generate.py`` in-process at
64 closed-loop streams (the lengths of ``benchmarks/streaming.py``), alternating
the settings so that the machine's noise hits each alike. The setting is not on
``Stage``: the run sets the step loop's defaults for each contender.

Run: ``python benchmarks/stream_admission.py`` (about 40 s); prints one line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from typing import Any

from streaming import lengths, run_one  # first: it puts the repository root on sys.path

# isort: split
from examples.generate import CharModel, Prompt
from microbatch import stepping

SETTINGS = {"continuous": (1, 0.0), "gather 8 / 2 ms": (8, 0.002), "gather 16 / 4 ms": (16, 0.004)}


async def main(streams: int, rounds: int, repeats: int) -> None:
    """Each setting ``repeats`` times, alternating; one line of figures per run."""
    original = stepping.StepLoop.__init__
    work = lengths(rounds * streams, seed=streams)
    try:
        for _ in range(repeats):
            for label, (min_joiners, wait_s) in SETTINGS.items():
                stepping.StepLoop.__init__ = functools.partialmethod(  # type: ignore[method-assign]
                    original, min_joiners=min_joiners, max_join_wait_s=wait_s
                )
                figures: dict[str, Any] = await run_one(
                    CharModel,
                    streams,
                    work,
                    item=lambda n: Prompt("Beautiful is ", max_tokens=n),
                    kwargs={"train_s": 2.0},
                )
                shown = {k: round(v, 2) for k, v in figures.items() if isinstance(v, float)}
                print(f"{label:18} {shown}", flush=True)
    finally:
        stepping.StepLoop.__init__ = original  # type: ignore[method-assign]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8, help="streams per client")
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.streams, arguments.rounds, arguments.repeats))
