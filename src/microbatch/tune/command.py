"""The ``microbatch tune MODULE:ATTR`` command: measure, advise, print."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .advice import recommend
from .measure import TuneError, load_service, measure_service
from .report import PlotUnavailable, plot, to_json, to_text

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Add the ``tune`` sub-command to an argparse sub-parsers object."""
    tune = commands.add_parser(
        "tune",
        help="measure a service's models in-process and advise batching settings",
        description="Run each stage's model on the service's warm-up examples at batch "
        "sizes 1, 2, 4, ... and advise max_batch_size and max_latency_ms per stage.",
    )
    tune.add_argument("target", metavar="MODULE:ATTR", help="e.g. examples.embeddings:service")
    tune.add_argument("--p99-ms", type=float, default=50.0, help="latency target (default 50)")
    tune.add_argument("--max-batch", type=int, default=64, help="largest batch tried (default 64)")
    tune.add_argument("--repeats", type=int, default=5, help="timed runs per size (default 5)")
    tune.add_argument("--warmup", type=int, default=1, help="untimed runs per size (default 1)")
    tune.add_argument(
        "--gain", type=float, default=0.05, help="least throughput gain worth a larger batch"
    )
    tune.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tune.add_argument("--plot", metavar="PNG", help="draw the curves and the advice to this file")


def run(args: argparse.Namespace) -> int:
    """Run ``tune`` with parsed arguments; return the exit status."""
    if args.max_batch < 1 or args.repeats < 1 or args.warmup < 0 or not args.p99_ms > 0:
        print(
            "tune: need --max-batch >= 1, --repeats >= 1, --warmup >= 0, --p99-ms > 0",
            file=sys.stderr,
        )
        return 2
    try:
        service = load_service(args.target)
        curves = measure_service(
            service,
            max_batch=args.max_batch,
            repeats=args.repeats,
            warmup=args.warmup,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except TuneError as exc:
        print(f"tune: {exc}", file=sys.stderr)
        return 1
    advice = recommend(curves, args.p99_ms, gain=args.gain)
    if args.json:
        print(json.dumps(to_json(advice, args.target), indent=2))
    else:
        print(to_text(advice, args.target))
    if args.plot:
        try:
            plot(advice, args.plot, args.target)
        except PlotUnavailable as exc:
            print(f"tune: {exc}", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
